/*
 * tzinspect: lists the tensors of a tensorizer file and loads them all,
 * optionally verifying their hashes, using only <tensorizer.h>.
 *
 *   tzinspect FILE [--verify] [--threads N] [--quiet]
 *
 * Build against an installed libtensorizer:
 *   cc tzinspect.c $(pkg-config --cflags --libs tensorizer) -o tzinspect
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tensorizer.h>

static int report(int rc, const char *what) {
  fprintf(stderr, "%s failed: %s (%s)\n", what, tz_error_last(), tz_status_name(rc));
  return 1;
}

static void print_name(const tz_tensor_info *info) {
  for (size_t k = 0; k < info->path_len; ++k) {
    const tz_path_component *c = &info->path[k];
    if (k) putchar('/');
    if (c->is_index) printf("%llu", (unsigned long long)c->index);
    else printf("%.*s", (int)c->str_len, c->str);
  }
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int verify = 0, quiet = 0;
  unsigned threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--verify") == 0) verify = 1;
    else if (strcmp(argv[i], "--quiet") == 0) quiet = 1;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = (unsigned)atoi(argv[++i]);
    else path = argv[i];
  }
  if (!path) {
    fprintf(stderr, "usage: %s FILE [--verify] [--threads N] [--quiet]\n", argv[0]);
    return 2;
  }

  tz_reader *reader = NULL;
  int rc = tz_reader_open(&reader, path, NULL);
  if (rc != TZ_OK) return report(rc, "open");
  tz_file_info file = TZ_FILE_INFO_INIT;
  if ((rc = tz_reader_file_info(&file, reader)) != TZ_OK) return report(rc, "file_info");
  printf("%s: data version %u, %llu tensors, libtensorizer %s\n", path, file.data_version,
         (unsigned long long)file.tensor_count, tz_version());

  /* One caller-owned buffer per tensor; the library fills them in parallel. */
  tz_read_request *reqs = calloc(file.tensor_count, sizeof *reqs);
  uint64_t total = 0;
  for (uint64_t i = 0; i < file.tensor_count; ++i) {
    tz_tensor_info info = TZ_TENSOR_INFO_INIT;
    if ((rc = tz_reader_tensor_info(&info, reader, i)) != TZ_OK) return report(rc, "tensor_info");
    reqs[i].version = TZ_READ_REQUEST_VERSION; /* every element: the library checks each */
    reqs[i].index = i;
    reqs[i].dst = malloc(info.nbytes ? info.nbytes : 1);
    reqs[i].dst_size = info.nbytes;
    total += info.nbytes;
    if (!quiet) {
      printf("  ");
      print_name(&info);
      printf("  dtype=%s shape=(", info.torch_dtype ? info.torch_dtype : info.dtype);
      for (uint32_t d = 0; d < info.ndim; ++d) printf(d ? ",%llu" : "%llu", (unsigned long long)info.shape[d]);
      printf(")%s\n", info.is_meta ? " meta" : "");
    }
  }

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  size_t failed = 0;
  rc = tz_reader_read_batch(reader, reqs, (size_t)file.tensor_count,
                            verify ? TZ_READ_VERIFY_HASH : TZ_READ_NO_VERIFY_HASH, threads, &failed);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc != TZ_OK) return report(rc, "read");
  const double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("loaded %llu bytes in %.3f s (%.2f GB/s)%s\n", (unsigned long long)total, secs,
         secs > 0 ? (double)total / secs / 1e9 : 0.0, verify ? ", hashes verified" : "");

  for (uint64_t i = 0; i < file.tensor_count; ++i) free(reqs[i].dst);
  free(reqs);
  tz_reader_free(reader);
  return 0;
}
