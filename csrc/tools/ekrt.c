/* ekrt: the static device runner (docs/ekrt.md). No Python needed on the device.
 *
 *   ekrt info  [MODEL.ekm] [--json]
 *   ekrt run   MODEL.ekm [--inputs A.npy ...] [--seed N] [--threads N] [--save DIR] [--json]
 *   ekrt bench MODEL.ekm [--iterations N | --duration S] [--warmup N] [--threads N] [--profile]
 *                        [--inputs A.npy ...] [--seed N] [--variant NAME] [--bundle-hash HEX] [--json]
 *
 * bench --json prints one document in the agent's bench schema (docs/bundle-and-agent.md).
 * Without --threads the runner uses every online core (config.threads is then null).
 * Without --inputs, inputs are numpy.random.RandomState(seed).standard_normal(shape) as
 * float32 (seed 0), the same values the Python agent feeds other backends. Failures print
 * {"kind": "edgekit.error", "error", "hint"} with --json, else error:/hint: lines; exit 1
 * (2 for a usage error). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "edgekit/ekrt.h"

#define MAX_IO 64
#define MAX_SAMPLES 1000000

#if defined(__aarch64__)
#define EKRT_ARCH "aarch64"
#elif defined(__x86_64__)
#define EKRT_ARCH "x86_64"
#elif defined(__arm__)
#define EKRT_ARCH "armv7l"
#else
#define EKRT_ARCH "unknown"
#endif

static int json_mode;

static void die(int code, const char* hint, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (json_mode) {
    fputs("{\"schema\": 1, \"kind\": \"edgekit.error\", \"error\": \"", stdout);
    for (const char* p = msg; *p; p++) {
      unsigned char ch = (unsigned char)*p;
      if (ch == '"' || ch == '\\') printf("\\%c", ch);
      else if (ch < 0x20) printf("\\u%04x", ch);
      else putchar(ch);
    }
    fputs("\", \"hint\": \"", stdout);
    for (const char* p = hint; *p; p++) {
      if (*p == '"' || *p == '\\') putchar('\\');
      putchar(*p);
    }
    fputs("\"}\n", stdout);
    fflush(stdout);
  } else {
    fprintf(stderr, "error: %s\nhint: %s\n", msg, hint);
  }
  exit(code);
}

static const char* USAGE_HINT = "usage: ekrt info|run|bench MODEL.ekm [--json] [--iterations N] [--warmup N] "
                                "[--duration S] [--threads N] [--profile] [--inputs A.npy ...] [--seed N] [--save DIR]";

/* ---- JSON output ---- */

static void json_str(const char* s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}
static void json_cstr(const char* s) {
  if (s) json_str(s, strlen(s));
  else fputs("null", stdout);
}

/* ---- SHA-256 (FIPS 180-4) of the model file, for the bench document ---- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
    0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
    0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
    0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

static int sha256_file(const char* path, char hex[65]) {
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf[64 * 1024 + 128];
  uint64_t total = 0;
  size_t got;
  size_t carry = 0;
  while ((got = fread(buf + carry, 1, 64 * 1024, f)) > 0) {
    size_t have = carry + got, off = 0;
    total += got;
    for (; off + 64 <= have; off += 64) sha256_block(h, buf + off);
    carry = have - off;
    memmove(buf, buf + off, carry);
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) return -1;
  buf[carry++] = 0x80;
  if (carry > 56) {
    memset(buf + carry, 0, 64 - carry);
    sha256_block(h, buf);
    carry = 0;
  }
  memset(buf + carry, 0, 56 - carry);
  uint64_t bits = total * 8;
  for (int i = 0; i < 8; i++) buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
  sha256_block(h, buf);
  for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", h[i]);
  return 0;
}

/* ---- numpy's legacy RandomState(seed).standard_normal: MT19937 + polar Box-Muller ---- */

struct mt {
  uint32_t s[624];
  int i;
  int has_gauss;
  double gauss;
};

static void mt_seed(struct mt* m, uint32_t seed) {
  m->s[0] = seed;
  for (int i = 1; i < 624; i++) m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
  m->i = 624;
  m->has_gauss = 0;
}

static uint32_t mt_next(struct mt* m) {
  if (m->i >= 624) {
    for (int k = 0; k < 624; k++) {
      uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
      m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
    }
    m->i = 0;
  }
  uint32_t y = m->s[m->i++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

static double mt_double(struct mt* m) {
  uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

static double mt_gauss(struct mt* m) {
  if (m->has_gauss) {
    m->has_gauss = 0;
    return m->gauss;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * mt_double(m) - 1.0;
    x2 = 2.0 * mt_double(m) - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  double f = sqrt(-2.0 * log(r2) / r2);
  m->gauss = f * x1;
  m->has_gauss = 1;
  return f * x2;
}

/* ---- .npy files (float32 or float64, C order) ---- */

static float* read_npy(const char* path, size_t want, const uint32_t* dims, int rank) {
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
  int f8 = strstr(h, "'<f8'") != NULL;
  if (!strstr(h, "'<f4'") && !f8) die(1, "save the input as float32", "%s: dtype is not float32 or float64 (little-endian)", path);
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
  int same = got_rank == rank;
  for (int d = 0; same && d < rank; d++) same = got_dims[d] == dims[d];
  if (n != want || !same) die(1, "give one array per model input, in order, of the input's shape", "%s has %zu elements in %d dims, the input wants %zu", path, n, got_rank, want);
  free(h);
  float* out = malloc(want * sizeof *out + 64);
  if (!out) die(1, "free some memory", "out of memory");
  if (f8) {
    for (size_t i = 0; i < want; i++) {
      double v;
      if (fread(&v, 8, 1, f) != 1) die(1, "save it again with numpy.save", "%s: truncated data", path);
      out[i] = (float)v;
    }
  } else if (fread(out, 4, want, f) != want) {
    die(1, "save it again with numpy.save", "%s: truncated data", path);
  }
  fclose(f);
  return out;
}

static void write_npy(const char* path, const float* data, int rank, const uint32_t* dims) {
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

/* ---- device facts (the subset a C program can read without help) ---- */

static void read_line_value(const char* path, const char* key, char* out, size_t out_len) {
  out[0] = '\0';
  FILE* f = fopen(path, "r");
  if (!f) return;
  char line[512];
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) != 0) continue;
    char* v = line + kl;
    while (*v == ' ' || *v == '\t' || *v == ':' || *v == '=') v++;
    if (*v == '"') v++;
    size_t n = strcspn(v, "\"\n");
    if (n >= out_len) n = out_len - 1;
    memcpy(out, v, n);
    out[n] = '\0';
    break;
  }
  fclose(f);
}

static void print_features(void) {
  uint64_t f = ekrt_cpu_features();
  const char* names[] = {"neon", "neondot", "avx2", "avx512vnni"};
  uint64_t bits[] = {EKRT_CPU_NEON, EKRT_CPU_NEONDOT, EKRT_CPU_AVX2, EKRT_CPU_AVX512VNNI};
  int first = 1;
  putchar('[');
  for (int i = 0; i < 4; i++)
    if (f & bits[i]) {
      printf("%s\"%s\"", first ? "" : ", ", names[i]);
      first = 0;
    }
  putchar(']');
}

static void print_device(void) {
  struct utsname u;
  memset(&u, 0, sizeof u);
  uname(&u);
  char os[256], cpu[256];
  read_line_value("/etc/os-release", "PRETTY_NAME", os, sizeof os);
  read_line_value("/proc/cpuinfo", "model name", cpu, sizeof cpu);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  fputs("{\"hostname\": ", stdout);
  json_cstr(u.nodename);
  fputs(", \"arch\": ", stdout);
  json_cstr(EKRT_ARCH);
  fputs(", \"cpu_model\": ", stdout);
  json_cstr(cpu[0] ? cpu : NULL);
  printf(", \"cores\": %ld, \"isa\": ", cores > 0 ? cores : 1);
  print_features();
  if (pages > 0 && page > 0) printf(", \"memory_bytes\": %lld", (long long)pages * page);
  else fputs(", \"memory_bytes\": null", stdout);
  fputs(", \"os\": ", stdout);
  json_cstr(os[0] ? os : u.sysname);
  fputs(", \"kernel\": ", stdout);
  json_cstr(u.release);
  fputs(", \"python\": null, \"runtimes\": {\"ekrt\": \"" EKRT_VERSION_STRING "\"}}", stdout);
}

static void print_kernels(void) {
  putchar('{');
  for (int i = 0; i < ekrt_num_kernel_families(); i++) {
    const char *fam, *name;
    ekrt_kernel_choice(i, &fam, &name);
    printf("%s\"%s\": \"%s\"", i ? ", " : "", fam, name);
  }
  putchar('}');
}

static void print_built(void) {
  const char* b = ekrt_built_isas();
  putchar('[');
  for (const char* p = b; *p;) {
    size_t n = strcspn(p, ",");
    printf("%s\"%.*s\"", p == b ? "" : ", ", (int)n, p);
    p += n;
    if (*p == ',') p++;
  }
  putchar(']');
}

/* ---- options ---- */

struct opts {
  const char* cmd;
  const char* model;
  int json, profile, threads;
  long iterations, warmup;
  double duration;
  int n_inputs;
  const char* inputs[MAX_IO];
  unsigned long seed;
  const char* save;
  const char* variant;
  const char* bundle_hash;
};

static long parse_long(const char* flag, const char* v, long lo, long hi) {
  char* end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || errno || *end || x < lo || x > hi) die(2, USAGE_HINT, "%s wants an integer in %ld..%ld, got '%s'", flag, lo, hi, v ? v : "");
  return x;
}

static int safe_token(const char* s) {
  if (!*s || strlen(s) > 128) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.')) return 0;
  return 1;
}

static void parse(int argc, char** argv, struct opts* o) {
  memset(o, 0, sizeof *o);
  o->iterations = 100;
  o->warmup = 10;
  o->threads = 0;
  o->variant = "int8";
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0) json_mode = o->json = 1;
  if (argc < 2) die(2, USAGE_HINT, "no command");
  o->cmd = argv[1];
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--json") == 0) continue;
    if (strcmp(a, "--profile") == 0) o->profile = 1;
    else if (strcmp(a, "--iterations") == 0) o->iterations = parse_long(a, v, 1, MAX_SAMPLES), i++;
    else if (strcmp(a, "--warmup") == 0) o->warmup = parse_long(a, v, 0, 1000000), i++;
    else if (strcmp(a, "--threads") == 0) o->threads = (int)parse_long(a, v, 1, 256), i++;
    else if (strcmp(a, "--seed") == 0) o->seed = (unsigned long)parse_long(a, v, 0, 0x7fffffffL), i++;
    else if (strcmp(a, "--duration") == 0) {
      char* end;
      o->duration = v ? strtod(v, &end) : 0;
      if (!v || *end || !(o->duration > 0) || o->duration > 86400) die(2, USAGE_HINT, "--duration wants seconds > 0, got '%s'", v ? v : "");
      i++;
    } else if (strcmp(a, "--save") == 0) {
      if (!v) die(2, USAGE_HINT, "--save wants a directory");
      o->save = v, i++;
    } else if (strcmp(a, "--variant") == 0 || strcmp(a, "--bundle-hash") == 0) {
      if (!v || !safe_token(v)) die(2, "use letters, digits, '-', '_' and '.'", "%s wants a name, got '%s'", a, v ? v : "");
      if (a[2] == 'v') o->variant = v;
      else o->bundle_hash = v;
      i++;
    } else if (strcmp(a, "--inputs") == 0) {
      while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
        if (o->n_inputs >= MAX_IO) die(2, USAGE_HINT, "more than %d --inputs", MAX_IO);
        o->inputs[o->n_inputs++] = argv[++i];
      }
      if (!o->n_inputs) die(2, USAGE_HINT, "--inputs wants one .npy file per model input");
    } else if (a[0] == '-' && a[1] == '-') {
      die(2, USAGE_HINT, "unknown option %s", a);
    } else if (!o->model) {
      o->model = a;
    } else {
      die(2, USAGE_HINT, "unexpected argument '%s'", a);
    }
  }
}

/* ---- commands ---- */

struct loaded {
  ekrt_model* m;
  int n_in, n_out;
  float* in[MAX_IO];
  float* out[MAX_IO];
  uint64_t load_ns;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void load_model(const struct opts* o, struct loaded* l) {
  if (!o->model) die(2, USAGE_HINT, "%s needs a MODEL.ekm", o->cmd);
  char err[512];
  uint64_t t0 = now_ns();
  int rc = ekrt_load_file(o->model, &l->m, err, sizeof err);
  l->load_ns = now_ns() - t0;
  if (rc == EKRT_EIO) die(1, "check the path", "%s", err);
  if (rc) die(1, "re-create the model with edgekit (the lowering writes .ekm files)", "%s is not a valid .ekm file: %s", o->model, err);
  /* without --threads: every online core, like other runtimes' default (config.threads: null) */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = o->threads ? o->threads : (int)(cores < 1 ? 1 : cores > 256 ? 256 : cores);
  rc = ekrt_set_threads(l->m, threads);
  if (rc) die(1, "use fewer --threads", "cannot start %d threads (code %d)", threads, rc);
  l->n_in = ekrt_num_inputs(l->m);
  l->n_out = ekrt_num_outputs(l->m);
  if (o->n_inputs && o->n_inputs != l->n_in) die(2, "give one .npy per model input, in order", "the model has %d inputs, --inputs gave %d", l->n_in, o->n_inputs);
  struct mt rng;
  mt_seed(&rng, (uint32_t)o->seed);
  for (int i = 0; i < l->n_in; i++) {
    size_t n = ekrt_io_elements(l->m, 0, i);
    int rank;
    uint32_t dims[4];
    ekrt_io_info(l->m, 0, i, NULL, NULL, &rank, dims);
    if (o->n_inputs) {
      l->in[i] = read_npy(o->inputs[i], n, dims, rank);
    } else {
      l->in[i] = malloc(n * sizeof(float) + 64);
      if (!l->in[i]) die(1, "free some memory", "out of memory");
      for (size_t k = 0; k < n; k++) l->in[i][k] = (float)mt_gauss(&rng);
    }
  }
  for (int i = 0; i < l->n_out; i++) {
    l->out[i] = calloc(ekrt_io_elements(l->m, 1, i) + 16, sizeof(float));
    if (!l->out[i]) die(1, "free some memory", "out of memory");
  }
}

static void free_model(struct loaded* l) {
  for (int i = 0; i < l->n_in; i++) free(l->in[i]);
  for (int i = 0; i < l->n_out; i++) free(l->out[i]);
  ekrt_free(l->m);
}

static void run_once(struct loaded* l) {
  int rc = ekrt_run(l->m, (const float* const*)l->in, l->out);
  if (rc) die(1, "report this with the model", "ekrt_run failed (code %d)", rc);
}

static void print_io(const ekrt_model* m, int is_output) {
  int n = is_output ? ekrt_num_outputs(m) : ekrt_num_inputs(m);
  putchar('[');
  for (int i = 0; i < n; i++) {
    const char* name;
    size_t len;
    int rank;
    uint32_t dims[4];
    ekrt_io_info(m, is_output, i, &name, &len, &rank, dims);
    fputs(i ? ", {\"name\": " : "{\"name\": ", stdout);
    json_str(name, len);
    fputs(", \"shape\": [", stdout);
    for (int d = 0; d < rank; d++) printf("%s%u", d ? ", " : "", dims[d]);
    fputs("], \"dtype\": \"float32\"}", stdout);
  }
  putchar(']');
}

static int cmd_info(const struct opts* o) {
  struct loaded l;
  memset(&l, 0, sizeof l);
  if (o->model) load_model(o, &l);
  const char* forced = getenv("EKRT_ISA");
  if (o->json) {
    printf("{\"schema\": 1, \"kind\": \"edgekit.ekrt.info\", \"version\": \"%s\", \"arch\": \"%s\", \"isa\": \"%s\", \"features\": ",
           EKRT_VERSION_STRING, EKRT_ARCH, ekrt_isa_name());
    print_features();
    fputs(", \"built_isas\": ", stdout);
    print_built();
    fputs(", \"forced_isa\": ", stdout);
    json_cstr(forced && *forced ? forced : NULL);
    fputs(", \"kernels\": ", stdout);
    print_kernels();
    if (l.m) {
      fputs(", \"model\": {\"path\": ", stdout);
      json_cstr(o->model);
      printf(", \"ops\": %d, \"memory_bytes\": %zu, \"inputs\": ", ekrt_num_ops(l.m), ekrt_memory_bytes(l.m));
      print_io(l.m, 0);
      fputs(", \"outputs\": ", stdout);
      print_io(l.m, 1);
      putchar('}');
    }
    fputs("}\n", stdout);
  } else {
    printf("ekrt %s (%s)\nisa: %s%s%s\nbuilt isas: %s\nfeatures:", EKRT_VERSION_STRING, EKRT_ARCH, ekrt_isa_name(),
           forced && *forced ? " (EKRT_ISA=" : "", forced && *forced ? forced : "", ekrt_built_isas());
    if (forced && *forced) fputs(")", stdout);
    uint64_t f = ekrt_cpu_features();
    if (!f) fputs(" none", stdout);
    if (f & EKRT_CPU_NEON) fputs(" neon", stdout);
    if (f & EKRT_CPU_NEONDOT) fputs(" neondot", stdout);
    if (f & EKRT_CPU_AVX2) fputs(" avx2", stdout);
    if (f & EKRT_CPU_AVX512VNNI) fputs(" avx512vnni", stdout);
    putchar('\n');
    for (int i = 0; i < ekrt_num_kernel_families(); i++) {
      const char *fam, *name;
      ekrt_kernel_choice(i, &fam, &name);
      printf("%-11s %s\n", fam, name);
    }
    if (l.m) printf("model: %s, %d ops, %zu bytes of memory\n", o->model, ekrt_num_ops(l.m), ekrt_memory_bytes(l.m));
  }
  if (l.m) free_model(&l);
  return 0;
}

static int cmd_run(const struct opts* o) {
  struct loaded l;
  memset(&l, 0, sizeof l);
  load_model(o, &l);
  run_once(&l);
  if (o->save) {
    for (int i = 0; i < l.n_out; i++) {
      char path[4096];
      int rank;
      uint32_t dims[4];
      ekrt_io_info(l.m, 1, i, NULL, NULL, &rank, dims);
      snprintf(path, sizeof path, "%s/output%d.npy", o->save, i);
      write_npy(path, l.out[i], rank, dims);
    }
  }
  if (o->json) {
    fputs("{\"schema\": 1, \"kind\": \"edgekit.ekrt.run\", \"isa\": ", stdout);
    json_cstr(ekrt_isa_name());
    fputs(", \"outputs\": [", stdout);
    for (int i = 0; i < l.n_out; i++) {
      const char* name;
      size_t len;
      int rank;
      uint32_t dims[4];
      ekrt_io_info(l.m, 1, i, &name, &len, &rank, dims);
      fputs(i ? ", {\"name\": " : "{\"name\": ", stdout);
      json_str(name, len);
      fputs(", \"shape\": [", stdout);
      for (int d = 0; d < rank; d++) printf("%s%u", d ? ", " : "", dims[d]);
      fputs("], \"values\": [", stdout);
      size_t n = ekrt_io_elements(l.m, 1, i);
      for (size_t k = 0; k < n; k++) printf("%s%.9g", k ? ", " : "", (double)l.out[i][k]);
      fputs("]}", stdout);
    }
    fputs("]}\n", stdout);
  } else {
    for (int i = 0; i < l.n_out; i++) {
      const char* name;
      size_t len;
      ekrt_io_info(l.m, 1, i, &name, &len, NULL, NULL);
      size_t n = ekrt_io_elements(l.m, 1, i), best = 0;
      for (size_t k = 1; k < n; k++)
        if (l.out[i][k] > l.out[i][best]) best = k;
      printf("%.*s: %zu values, argmax %zu (%g)\n", (int)len, name, n, best, (double)l.out[i][best]);
    }
  }
  free_model(&l);
  return 0;
}

static int cmp_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static int cmd_bench(const struct opts* o) {
  char started[64];
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%S+00:00", &tmv);
  struct loaded l;
  memset(&l, 0, sizeof l);
  load_model(o, &l);
  char sha[65] = "";
  if (sha256_file(o->model, sha) != 0) sha[0] = '\0';
  uint64_t t0 = now_ns();
  run_once(&l);
  uint64_t first_ns = now_ns() - t0;
  for (long i = 0; i < o->warmup; i++) run_once(&l);
  if (o->profile) ekrt_profile(l.m, 1);
  size_t cap = o->duration > 0 ? 1024 : (size_t)o->iterations, n = 0;
  uint64_t* samples = malloc(cap * sizeof *samples);
  if (!samples) die(1, "use fewer --iterations", "out of memory");
  uint64_t deadline = o->duration > 0 ? now_ns() + (uint64_t)(o->duration * 1e9) : 0;
  for (;;) {
    uint64_t a = now_ns();
    run_once(&l);
    uint64_t b = now_ns();
    if (n == cap) {
      cap *= 2;
      uint64_t* ns = realloc(samples, cap * sizeof *samples);
      if (!ns) die(1, "use a shorter --duration", "out of memory");
      samples = ns;
    }
    samples[n++] = b - a > 0 ? b - a : 1;
    if (o->duration > 0 ? (b >= deadline || n >= MAX_SAMPLES) : n >= (size_t)o->iterations) break;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long long peak = (long long)ru.ru_maxrss * 1024;
  uint32_t dims[4];
  int rank = 0;
  ekrt_io_info(l.m, 0, 0, NULL, NULL, &rank, dims);
  unsigned batch = rank >= 2 ? dims[0] : 1;
  if (o->json) {
    printf("{\"schema\": 1, \"kind\": \"edgekit.bench\", \"agent_version\": null, \"variant\": ");
    json_cstr(o->variant);
    printf(", \"backend\": \"native\", \"backend_version\": \"%s\", \"precision\": \"int8\", \"model\": ", EKRT_VERSION_STRING);
    json_cstr(o->model);
    fputs(", \"model_sha256\": ", stdout);
    json_cstr(sha[0] ? sha : NULL);
    fputs(", \"bundle_hash\": ", stdout);
    json_cstr(o->bundle_hash);
    printf(", \"config\": {\"warmup\": %ld, \"iterations\": ", o->warmup);
    if (o->duration > 0) printf("null, \"duration_s\": %g", o->duration);
    else printf("%ld, \"duration_s\": null", o->iterations);
    if (o->threads) printf(", \"threads\": %d", o->threads);
    else fputs(", \"threads\": null", stdout);
    printf(", \"batch\": %u}, \"samples_ns\": [", batch);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)samples[i]);
    printf("], \"load_ns\": %llu, \"first_inference_ns\": %llu, \"peak_rss_bytes\": %lld, \"layers\": ",
           (unsigned long long)l.load_ns, (unsigned long long)first_ns, peak);
    if (o->profile) {
      putchar('[');
      for (int j = 0; j < ekrt_num_ops(l.m); j++) {
        const char* name;
        uint64_t ns;
        ekrt_op_times(l.m, j, &name, &ns);
        printf("%s{\"name\": \"%s#%d\", \"op\": \"%s\", \"ns\": %llu}", j ? ", " : "", name, j, name,
               (unsigned long long)(ns / (n ? n : 1)));
      }
      putchar(']');
    } else {
      fputs("null", stdout);
    }
    printf(", \"backend_info\": {\"runner\": \"ekrt %s\", \"isa\": \"%s\", \"kernels\": ", EKRT_VERSION_STRING, ekrt_isa_name());
    print_kernels();
    fputs(", \"features\": ", stdout);
    print_features();
    printf(", \"threads\": %d, \"memory_bytes\": %zu}", ekrt_get_threads(l.m), ekrt_memory_bytes(l.m));
    printf(", \"started_at\": \"%s\", \"device\": ", started);
    print_device();
    fputs(", \"device_state\": null}\n", stdout);
  } else {
    qsort(samples, n, sizeof *samples, cmp_u64);
    printf("%s: %zu runs, p50 %.3f ms, min %.3f ms, max %.3f ms, load %.3f ms, peak RSS %.1f MB, isa %s, threads %d\n",
           o->model, n, samples[n / 2] / 1e6, samples[0] / 1e6, samples[n - 1] / 1e6, l.load_ns / 1e6, peak / 1048576.0,
           ekrt_isa_name(), ekrt_get_threads(l.m));
    if (o->profile)
      for (int j = 0; j < ekrt_num_ops(l.m); j++) {
        const char* name;
        uint64_t ns;
        ekrt_op_times(l.m, j, &name, &ns);
        printf("  %4d %-16s %10.1f us\n", j, name, ns / (double)(n ? n : 1) / 1e3);
      }
  }
  free(samples);
  free_model(&l);
  return 0;
}

int main(int argc, char** argv) {
  struct opts o;
  if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
    printf("ekrt %s (%s)\n", EKRT_VERSION_STRING, EKRT_ARCH);
    return 0;
  }
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0)) {
    printf("%s\n", USAGE_HINT + 7);
    return 0;
  }
  parse(argc, argv, &o);
  if (strcmp(o.cmd, "info") == 0) return cmd_info(&o);
  if (strcmp(o.cmd, "run") == 0) return cmd_run(&o);
  if (strcmp(o.cmd, "bench") == 0) return cmd_bench(&o);
  die(2, USAGE_HINT, "unknown command '%s'", o.cmd);
  return 2;
}
