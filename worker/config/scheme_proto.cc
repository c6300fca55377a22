// PrecisionScheme <-> keel.v1.PrecisionScheme (see scheme_proto.h).
#include "worker/config/scheme_proto.h"

namespace keel {
namespace {

void FormatToProto(const OperandFormat& f, v1::OperandFormat* out) {
  out->set_format(OperandFormatName(f));
  out->set_rounding(RoundingName(f.rounding));
  out->set_mx_block(f.mx_block);
  out->set_bump_exponent(f.bump_exponent);
  out->set_tile_16x16(f.tile_16x16);
  out->set_rht(f.rht);
}

Status FormatFromProto(const std::string& field, const v1::OperandFormat& in, OperandFormat* out) {
  KEEL_RETURN_IF_ERROR(ParseOperandFormat(field + ".format", in.format(), out));
  if (!ParseRounding(in.rounding(), &out->rounding)) {
    return Status::Error(field + ".rounding: unknown value '" + in.rounding() +
                         "' (allowed: nearest_even, nearest_away, stochastic)");
  }
  out->mx_block = in.mx_block() > 0 ? in.mx_block() : 32;
  out->bump_exponent = in.bump_exponent();
  out->tile_16x16 = in.tile_16x16();
  out->rht = in.rht();
  return Status::Ok();
}

}  // namespace

void SchemeToProto(const PrecisionScheme& s, v1::PrecisionScheme* out) {
  out->set_name(s.name);
  FormatToProto(s.roles[static_cast<int>(Role::kFwdX)], out->mutable_fwd_x());
  FormatToProto(s.roles[static_cast<int>(Role::kFwdW)], out->mutable_fwd_w());
  FormatToProto(s.roles[static_cast<int>(Role::kDgradDy)], out->mutable_dgrad_dy());
  FormatToProto(s.roles[static_cast<int>(Role::kDgradW)], out->mutable_dgrad_w());
  FormatToProto(s.roles[static_cast<int>(Role::kWgradDy)], out->mutable_wgrad_dy());
  FormatToProto(s.roles[static_cast<int>(Role::kWgradX)], out->mutable_wgrad_x());
  FormatToProto(s.layernorm, out->mutable_layernorm());
  out->set_forward_only(s.forward_only);
  out->set_bf16_first_blocks(s.bf16_first_blocks);
  out->set_bf16_last_blocks(s.bf16_last_blocks);
  out->set_bf16_head(s.bf16_head);
  out->set_attention_bf16(s.attention_bf16);
  out->set_post_qk_bf16(s.post_qk_bf16);
  if (s.hcp_channels > 0 || s.hcp_wgrad_rows > 0) {
    v1::HcpOptions* h = out->mutable_hcp();
    h->set_channels(s.hcp_channels);
    h->set_every(s.hcp_every);
    h->set_dgrad(s.hcp_dgrad);
    h->set_wgrad_rows(s.hcp_wgrad_rows);
  }
}

Status SchemeFromProto(const v1::PrecisionScheme& in, PrecisionScheme* out) {
  PrecisionScheme s;
  s.name = in.name().empty() ? "custom" : in.name();
  const v1::OperandFormat* roles[kRoleCount] = {&in.fwd_x(),    &in.fwd_w(),    &in.dgrad_dy(),
                                                &in.dgrad_w(),  &in.wgrad_dy(), &in.wgrad_x()};
  for (int r = 0; r < kRoleCount; ++r) {
    KEEL_RETURN_IF_ERROR(FormatFromProto(std::string("precision.") + RoleName(static_cast<Role>(r)), *roles[r], &s.roles[r]));
  }
  KEEL_RETURN_IF_ERROR(FormatFromProto("precision.layernorm", in.layernorm(), &s.layernorm));
  s.forward_only = in.forward_only();
  s.bf16_first_blocks = in.bf16_first_blocks();
  s.bf16_last_blocks = in.bf16_last_blocks();
  s.bf16_head = in.bf16_head();
  s.attention_bf16 = in.attention_bf16();
  s.post_qk_bf16 = in.post_qk_bf16();
  if (in.has_hcp()) {
    s.hcp_channels = in.hcp().channels();
    s.hcp_every = in.hcp().every();
    s.hcp_dgrad = in.hcp().dgrad();
    s.hcp_wgrad_rows = in.hcp().wgrad_rows();
  }
  KEEL_RETURN_IF_ERROR(ValidateScheme(s));
  *out = s;
  return Status::Ok();
}

}  // namespace keel
