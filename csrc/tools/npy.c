/* .npy files: float32/float64 (or int32/int64: byte or token ids, fed to the model as float32,
 * exact up to 2^24) C-order inputs in, float32 outputs out. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

float* read_npy(const char* path, size_t want, const uint32_t* dims, int rank) {
  size_t count;
  return read_npy_samples(path, want, dims, rank, 1, &count);
}

/* Like read_npy, but the file may stack up to max_count samples along the first axis (its first
 * dimension a multiple of the input's, the rest equal): `ekrt run` evaluates them all in one process. */
float* read_npy_samples(const char* path, size_t want, const uint32_t* dims, int rank, size_t max_count, size_t* count) {
  FILE* f = fopen(path, "rb");
  if (!f) die(1, "check the path given to --inputs", "cannot open %s: %s", path, strerror(errno));
  uint8_t pre[12];
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
    die(1, "save it with numpy.save", "%s is not a .npy file", path);
  size_t hlen;
  if (pre[6] == 1) {
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 10, 1, 2, f) != 2) die(1, "save it with numpy.save", "%s: truncated header", path);
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  if (hlen > 65536) die(1, "save it with numpy.save", "%s: header too long", path);
  char* h = calloc(1, hlen + 1);
  if (!h || fread(h, 1, hlen, f) != hlen) die(1, "save it with numpy.save", "%s: truncated header", path);
  int f8 = strstr(h, "'<f8'") != NULL, i4 = strstr(h, "'<i4'") != NULL, i8 = strstr(h, "'<i8'") != NULL;
  if (!strstr(h, "'<f4'") && !f8 && !i4 && !i8)
    die(1, "save the input as float32", "%s: dtype is not float32, float64, int32 or int64 (little-endian)", path);
  if (strstr(h, "'fortran_order': True")) die(1, "save a C-ordered array (numpy.ascontiguousarray)", "%s is Fortran-ordered", path);
  const char* sh = strstr(h, "'shape':");
  if (!sh) die(1, "save it with numpy.save", "%s: no shape in the header", path);
  sh = strchr(sh, '(');
  size_t n = 1;
  uint64_t got_dims[8];
  int got_rank = 0;
  for (const char* p = sh ? sh + 1 : ""; *p && *p != ')'; p++) {
    if (*p >= '0' && *p <= '9') {
      char* end;
      unsigned long long v = strtoull(p, &end, 10);
      if (got_rank < 8) got_dims[got_rank] = v;
      got_rank++;
      n *= (size_t)v;
      p = end - 1;
    }
  }
  size_t k = 0;
  if (got_rank == rank && rank == 0) {
    k = 1;
  } else if (got_rank == rank && rank <= 8 && dims[0] > 0 && got_dims[0] % dims[0] == 0) {
    k = (size_t)(got_dims[0] / dims[0]);
    for (int d = 1; k && d < rank; d++)
      if (got_dims[d] != dims[d]) k = 0;
  }
  if (k < 1 || k > max_count || n != want * k)
    die(1, "give one array per model input, in order, of the input's shape", "%s has %zu elements in %d dims, the input wants %zu", path, n, got_rank, want);
  free(h);
  *count = k;
  want *= k;
  float* out = malloc(want * sizeof *out + 64);
  if (!out) die(1, "free some memory", "out of memory");
  if (f8 || i4 || i8) {
    for (size_t i = 0; i < want; i++) {
      uint8_t b[8];
      if (fread(b, f8 || i8 ? 8 : 4, 1, f) != 1) die(1, "save it again with numpy.save", "%s: truncated data", path);
      double dv;
      int64_t lv = 0;
      int32_t iv;
      if (f8) memcpy(&dv, b, 8);
      else if (i8) memcpy(&lv, b, 8);
      else memcpy(&iv, b, 4), lv = iv;
      out[i] = f8 ? (float)dv : (float)lv;
    }
  } else if (fread(out, 4, want, f) != want) {
    die(1, "save it again with numpy.save", "%s: truncated data", path);
  }
  fclose(f);
  return out;
}

void write_npy(const char* path, const float* data, int rank, const uint32_t* dims) {
  char hdr[256], shape[128] = "";
  size_t at = 0;
  for (int d = 0; d < rank; d++) at += (size_t)snprintf(shape + at, sizeof shape - at, "%u%s", dims[d], rank == 1 ? "," : (d + 1 < rank ? ", " : ""));
  int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shape);
  size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
  FILE* f = fopen(path, "wb");
  if (!f) die(1, "check that the --save directory exists and is writable", "cannot write %s: %s", path, strerror(errno));
  uint16_t hl = (uint16_t)(n + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc(hl & 0xff, f);
  fputc(hl >> 8, f);
  fwrite(hdr, 1, (size_t)n, f);
  for (size_t i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  size_t elems = 1;
  for (int d = 0; d < rank; d++) elems *= dims[d];
  fwrite(data, 4, elems, f);
  if (fclose(f) != 0) die(1, "check the disk", "cannot write %s", path);
}

