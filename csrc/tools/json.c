/* JSON on stdout for the runner's documents, and its one way to fail (die): error/hint on
 * stderr, or with --json the agent's edgekit.error document on stdout. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

int json_mode;

void die(int code, const char* hint, const char* fmt, ...) {
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

void json_str(const char* s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}
void json_cstr(const char* s) {
  if (s) json_str(s, strlen(s));
  else fputs("null", stdout);
}

