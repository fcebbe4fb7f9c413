/* The runner's command line: ekrt info|run|bench MODEL.ekm [options] (usage errors exit 2). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

const char* USAGE_HINT = "usage: ekrt info|run|bench MODEL.ekm [--json] [--iterations N] [--warmup N|auto] "
                                "[--duration S] [--min-time S] [--threads N] [--profile] [--inputs A.npy ...] [--seed N] [--save DIR]";

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

void parse(int argc, char** argv, struct opts* o) {
  memset(o, 0, sizeof *o);
  o->iterations = 100;
  o->warmup = 0;
  o->warmup_auto = 1;
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
    else if (strcmp(a, "--warmup") == 0) {
      o->warmup_auto = v && strcmp(v, "auto") == 0;
      if (!o->warmup_auto) o->warmup = parse_long(a, v, 0, 1000000);
      i++;
    } else if (strcmp(a, "--threads") == 0) o->threads = (int)parse_long(a, v, 1, 256), i++;
    else if (strcmp(a, "--seed") == 0) o->seed = (unsigned long)parse_long(a, v, 0, 0x7fffffffL), i++;
    else if (strcmp(a, "--duration") == 0 || strcmp(a, "--min-time") == 0) {
      char* end;
      double s = v ? strtod(v, &end) : 0;
      if (!v || *end || !(s > 0) || s > 86400) die(2, USAGE_HINT, "%s wants seconds > 0, got '%s'", a, v ? v : "");
      if (a[2] == 'd') o->duration = s;
      else o->min_time = s;
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

