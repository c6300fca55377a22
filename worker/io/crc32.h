// CRC-32 as in zlib, gzip and PNG (IEEE 802.3 polynomial 0x04C11DB7, reflected
// 0xEDB88320, initial value and final xor 0xFFFFFFFF), computed by zlib. Crc32
// of "123456789" is 0xCBF43926.
#ifndef KEEL_WORKER_IO_CRC32_H_
#define KEEL_WORKER_IO_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace keel {

// Extends `crc` (the CRC-32 of the bytes before, 0 for none) with `size`
// bytes, like zlib's crc32(crc, data, size): Crc32(Crc32(0, a), b) is the
// CRC-32 of a followed by b.
uint32_t Crc32(uint32_t crc, const void* data, size_t size);

}  // namespace keel

#endif  // KEEL_WORKER_IO_CRC32_H_
