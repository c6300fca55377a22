// Precision schemes on the wire: worker/config/scheme.h's PrecisionScheme to and from
// proto/keel.proto's keel.v1.PrecisionScheme (every role spelled out).
#ifndef KEEL_WORKER_CONFIG_SCHEME_PROTO_H_
#define KEEL_WORKER_CONFIG_SCHEME_PROTO_H_

#include "kernels/base/status.h"
#include "proto/keel.pb.h"
#include "worker/config/scheme.h"

namespace keel {

void SchemeToProto(const PrecisionScheme& scheme, v1::PrecisionScheme* out);
// Validates (unknown format or rounding names, ValidateScheme's rules); the
// message names the field.
Status SchemeFromProto(const v1::PrecisionScheme& in, PrecisionScheme* out);

}  // namespace keel

#endif  // KEEL_WORKER_CONFIG_SCHEME_PROTO_H_
