/* The C API from a C program (C11, -pedantic): compiled as C by the build,
 * so include/tierkv/c_api.h stays plain C, and run against a real tierkvd
 * by tests/python/test_c_api.py:
 *   c_api_smoke SOCKET TOKEN
 * Stores one segment, reads it back, checks the bytes, the per-item
 * statuses and a typed error, and prints "ok" (exit 0) or what failed. */
#include <stdio.h>
#include <string.h>

#include "tierkv/c_api.h"

#define CHECK(call)                                                   \
  do {                                                                \
    tierkv_status s_ = (call);                                        \
    if (s_ != TIERKV_OK) {                                            \
      fprintf(stderr, "%s failed: %s\n", #call, tierkv_last_error()); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_api_smoke SOCKET TOKEN\n");
    return 2;
  }
  tierkv_client_options options = {argv[1], 5000, 0, 0};
  tierkv_client* client = NULL;
  CHECK(tierkv_client_connect(&options, &client));
  CHECK(tierkv_open_namespace(client, "default", argv[2]));
  const uint32_t parts_per_layer[1] = {1};
  const char* names[1] = {"kv"};
  const uint32_t bytes_per_token[1] = {8};
  CHECK(tierkv_register_layout(client, 4, 1, parts_per_layer, names,
                               bytes_per_token));

  const uint32_t tokens[4] = {1, 2, 3, 4};
  tierkv_page_hash root, page;
  size_t pages = 0;
  CHECK(tierkv_root_page_hash("default", &root));
  CHECK(tierkv_page_hash_chain(&root, tokens, 4, 4, NULL, 0, &page, 1, &pages));
  const uint16_t layer = 0;
  const uint8_t part = 0;
  unsigned char in[32], out[32];
  for (int i = 0; i < 32; ++i) in[i] = (unsigned char)(i * 7);
  const void* src[1] = {in};
  void* dst[1] = {out};
  const uint64_t size = sizeof in;
  uint8_t status = 255, dedup = 255;
  CHECK(
      tierkv_put(client, &page, &layer, &part, src, &size, 1, &status, &dedup));
  CHECK(tierkv_get(client, &page, &layer, &part, dst, &size, 1, &status));
  if (memcmp(in, out, sizeof in) != 0 || status != TIERKV_OK || dedup != 0) {
    fprintf(stderr, "bytes or statuses differ\n");
    return 1;
  }
  uint32_t leading = 0;
  uint8_t tier = 0;
  CHECK(tierkv_match(client, &page, 1, &leading, &tier));
  if (leading != 1 || tier != TIERKV_TIER_HOST) {
    fprintf(stderr, "match: leading %u tier %u\n", leading, tier);
    return 1;
  }
  /* A wrong size: the item's status and the library's message. */
  const uint64_t wrong = 31;
  if (tierkv_get(client, &page, &layer, &part, dst, &wrong, 1, &status) !=
          TIERKV_INVALID_ARGUMENT ||
      status != TIERKV_INVALID_ARGUMENT ||
      strstr(tierkv_last_error(), "invalid_argument") == NULL) {
    fprintf(stderr, "wrong size not reported: %s\n", tierkv_last_error());
    return 1;
  }
  if (tierkv_match(NULL, &page, 1, &leading, NULL) != TIERKV_INVALID_ARGUMENT) {
    fprintf(stderr, "NULL client accepted\n");
    return 1;
  }
  tierkv_client_close(client);
  printf("ok %s\n", tierkv_status_name(TIERKV_OK));
  return 0;
}
