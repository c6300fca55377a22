// A share of a GPU (thousandths, the Run.gpu_milli of keel.proto) as text, for
// keeld's messages and the CLI: 250 -> "0.25", 500 -> "0.5", 1250 -> "1.25".
#ifndef KEEL_PROTO_GPU_SHARE_H_
#define KEEL_PROTO_GPU_SHARE_H_

#include <cstdint>
#include <string>

namespace keel {

inline std::string GpuShareText(int32_t milli) {
  std::string text = std::to_string(milli / 1000) + "." + std::to_string(1000 + milli % 1000).substr(1);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

}  // namespace keel

#endif  // KEEL_PROTO_GPU_SHARE_H_
