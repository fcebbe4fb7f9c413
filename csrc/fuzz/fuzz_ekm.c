/* libFuzzer harness for the .ekm loader (tests/test_fuzz.py builds it with ASan + UBSan).
 *
 * Each input is taken as an .ekm file whose header's file_size and checksum are fixed up first
 * (the fuzzer would otherwise never get past the CRC); the header check and the checksum
 * themselves are unit-tested (tests/test_ekrt_core.py). A file the loader accepts is run once
 * on small inputs when it is small enough to run in a blink. The loader must never crash, leak,
 * read out of bounds or hit undefined behaviour, and every rejection must come with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edgekit/ekrt.h"

#define MAX_RUN_BYTES (8u << 20)
#define MAX_RUN_MACS 20000000u

static uint32_t crc32_ieee(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t* buf = malloc(size ? size : 1);
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  if (size >= 128) {
    uint64_t file_size = size;
    memcpy(buf + 16, &file_size, 8);
    uint32_t crc = crc32_ieee(buf + 128, size - 128);
    memcpy(buf + 24, &crc, 4);
  }
  ekrt_model* m = NULL;
  char err[512];
  err[0] = '\0';
  int rc = ekrt_load(buf, size, &m, err, sizeof err);
  free(buf); /* the model must not keep pointers into the caller's bytes */
  if (rc != EKRT_OK) {
    if (m != NULL || (rc == EKRT_EFORMAT && err[0] == '\0')) __builtin_trap();
    return 0;
  }
  if (ekrt_memory_bytes(m) <= MAX_RUN_BYTES && ekrt_macs(m) <= MAX_RUN_MACS) {
    int n_in = ekrt_num_inputs(m), n_out = ekrt_num_outputs(m);
    float* in[64] = {0};
    float* out[64] = {0};
    int ok = 1;
    for (int i = 0; i < n_in; i++) {
      size_t n = ekrt_io_elements(m, 0, i);
      in[i] = malloc(n * sizeof(float));
      if (!in[i]) ok = 0;
      for (size_t k = 0; in[i] && k < n; k++) in[i][k] = (float)((int)(k * 2654435761u % 2001) - 1000) * 0.01f;
    }
    for (int i = 0; i < n_out; i++) {
      out[i] = malloc(ekrt_io_elements(m, 1, i) * sizeof(float));
      if (!out[i]) ok = 0;
    }
    if (ok && ekrt_run(m, (const float* const*)in, out) != EKRT_OK) __builtin_trap();
    for (int i = 0; i < n_in; i++) free(in[i]);
    for (int i = 0; i < n_out; i++) free(out[i]);
  }
  ekrt_free(m);
  return 0;
}
