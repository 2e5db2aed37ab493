/* A bundle built for a future ABI: the loader must refuse it. */
#include <stdint.h>
__attribute__((visibility("default"))) uint32_t silt_abi_version(void) {
  return 99;
}
