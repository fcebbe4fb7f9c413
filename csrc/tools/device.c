/* What the runner reports about itself and the device: the subset a C program can read
 * without help (uname, /etc/os-release, /proc/cpuinfo, sysconf) and ekrt's ISA choices. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "edgekit/cpu.h"
#include "edgekit/ekrt.h"
#include "runner.h"

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

void print_features(void) {
  char names[128];
  ek_cpu_feature_list(ekrt_cpu_features(), names, sizeof names, "\", \"");
  printf(names[0] ? "[\"%s\"]" : "[%s]", names);
}

void print_device(void) {
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

void print_kernels(void) {
  putchar('{');
  for (int i = 0; i < ekrt_num_kernel_families(); i++) {
    const char *fam, *name;
    ekrt_kernel_choice(i, &fam, &name);
    printf("%s\"%s\": \"%s\"", i ? ", " : "", fam, name);
  }
  putchar('}');
}

void print_model_kernels(const ekrt_model* m) {
  /* the distinct GEMM / depthwise kernels the model's ops run, in op order (a per-family
   * `kernels` entry is the CPU's pick for any weights; an op's weights may allow a better one) */
  enum { MAX_SEEN = 16 };
  const char* seen[MAX_SEEN];
  int n_seen = 0;
  putchar('[');
  for (int j = 0; j < ekrt_num_ops(m); j++) {
    const char* k = ekrt_op_kernel(m, j);
    int dup = 0;
    for (int i = 0; i < n_seen && !dup; i++) dup = strcmp(seen[i], k ? k : "") == 0;
    if (!k || dup || n_seen == MAX_SEEN) continue;
    printf("%s\"%s\"", n_seen ? ", " : "", k);
    seen[n_seen++] = k;
  }
  putchar(']');
}

void print_built(void) {
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

