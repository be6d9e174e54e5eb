/* The C API's weights calls from a C program (C11, -pedantic), run against
 * a real tierkvd with a weights namespace by tests/python/test_c_api.py:
 *   c_api_weights SOCKET TOKEN
 * Puts a three-layer shard (a 1 MiB tensor of its own and packs), loads it
 * into a caller buffer waiting layer by layer, then into a registered
 * image pool (a memfd the daemon fills), checks the bytes, lists and drops
 * it, checks a typed error, and prints "ok" (exit 0) or what failed. */
#define _GNU_SOURCE /* memfd_create */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tierkv/c_api.h"

#define CHECK(call)                                                   \
  do {                                                                \
    tierkv_status s_ = (call);                                        \
    if (s_ != TIERKV_OK) {                                            \
      fprintf(stderr, "%s failed: %s\n", #call, tierkv_last_error()); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

#define EXPECT(cond)                           \
  do {                                         \
    if (!(cond)) {                             \
      fprintf(stderr, "expected %s\n", #cond); \
      return 1;                                \
    }                                          \
  } while (0)

enum { kTensors = 4, kBig = (1 << 20) + 5 };

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_api_weights SOCKET TOKEN\n");
    return 2;
  }
  tierkv_client_options options = {argv[1], 5000, 0, 0};
  tierkv_client* client = NULL;
  CHECK(tierkv_client_connect(&options, &client));
  CHECK(tierkv_open_namespace(client, "weights", argv[2]));

  static unsigned char norm[64], big[kBig], bias[100], head[300];
  unsigned char* data[kTensors] = {norm, big, bias, head};
  const uint64_t sizes[kTensors] = {sizeof norm, sizeof big, sizeof bias,
                                    sizeof head};
  const char* names[kTensors] = {"layers.0.norm", "layers.1.w", "layers.1.bias",
                                 "lm_head"};
  const uint32_t layers[kTensors] = {0, 1, 1, 2};
  tierkv_weights_tensor tensors[kTensors];
  int64_t shapes[kTensors];
  for (int t = 0; t < kTensors; ++t) {
    for (uint64_t i = 0; i < sizes[t]; ++i) {
      data[t][i] = (unsigned char)(i * 13 + (uint64_t)t * 7 + 1);
    }
    shapes[t] = (int64_t)sizes[t];
    tensors[t].name = names[t];
    tensors[t].dtype = "U8";
    tensors[t].shape = &shapes[t];
    tensors[t].ndim = 1;
    tensors[t].layer = layers[t];
    tensors[t].data = data[t];
    tensors[t].bytes = sizes[t];
  }
  tierkv_weights_stored stored;
  CHECK(tierkv_weights_put(client, "c-model", "c/u8/rank0-of-1", tensors,
                           kTensors, &stored));
  EXPECT(stored.num_layers == 3 && stored.tensors == kTensors);
  EXPECT(stored.chunks_stored == stored.chunks);

  /* The manifest says where each tensor is in the image. */
  size_t len = 0;
  char* json = malloc(1 << 16);
  EXPECT(json != NULL);
  CHECK(tierkv_weights_manifest_json(client, "c-model", "c/u8/rank0-of-1",
                                     &stored.version, json, 1 << 16, &len));
  EXPECT(len < (1 << 16) && strstr(json, "\"layers.1.w\"") != NULL);
  free(json);

  unsigned char* image = malloc(stored.image_bytes);
  EXPECT(image != NULL);
  tierkv_weights_load* load = NULL;
  CHECK(tierkv_weights_load_start(client, "c-model", "c/u8/rank0-of-1", NULL,
                                  image, stored.image_bytes, 0, 0, &load));
  for (uint32_t l = 0; l < 3; ++l) {
    CHECK(tierkv_weights_load_wait_layer(load, l));
    EXPECT(tierkv_weights_load_layers_done(load) >= l + 1);
  }
  CHECK(tierkv_weights_load_wait(load));
  EXPECT(tierkv_weights_load_wait_layer(load, 3) == TIERKV_INVALID_ARGUMENT);
  /* NULL asked for the newest: the load says which version that was. */
  tierkv_page_hash loaded = {0, 0};
  CHECK(tierkv_weights_load_version(load, &loaded));
  EXPECT(loaded.lo == stored.version.lo && loaded.hi == stored.version.hi);
  tierkv_weights_load_free(load);
  /* Packed tensors are 256-byte aligned, large ones 4 KiB aligned: the
   * first tensor is at 0, and the 1 MiB one at 4096. */
  EXPECT(memcmp(image, norm, sizeof norm) == 0);
  EXPECT(memcmp(image + 4096, big, sizeof big) == 0);
  free(image);

  /* The same into the connection's image pool: the daemon moves the bytes. */
  int fd = memfd_create("image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT(fd >= 0);
  EXPECT(ftruncate(fd, (off_t)stored.image_bytes) == 0);
  unsigned char* pool = mmap(NULL, stored.image_bytes, PROT_READ | PROT_WRITE,
                             MAP_SHARED, fd, 0);
  EXPECT(pool != MAP_FAILED);
  CHECK(tierkv_register_pool(client, fd, 0, stored.image_bytes, 1, 0, 0));
  CHECK(tierkv_weights_load_to_pool_start(client, "c-model", "c/u8/rank0-of-1",
                                          NULL, 0, 0, &load));
  CHECK(tierkv_weights_load_wait_layer(load, 0));
  CHECK(tierkv_weights_load_wait(load));
  tierkv_weights_load_free(load);
  EXPECT(memcmp(pool, norm, sizeof norm) == 0);
  EXPECT(memcmp(pool + 4096, big, sizeof big) == 0);
  munmap(pool, stored.image_bytes);
  close(fd);

  char list[4096];
  CHECK(tierkv_weights_list_json(client, "c-model", list, sizeof list, &len));
  EXPECT(strstr(list, "\"c/u8/rank0-of-1\"") != NULL);

  /* Schedule: a hint (then cleared) and a pin (then ended) reach the
   * daemon's catalog (its stats count them). */
  char stats[8192];
  tierkv_weights_hint_item hint = {"c-model", "c/u8/rank0-of-1", NULL, 30000};
  CHECK(tierkv_weights_hint(client, &hint, 1));
  CHECK(tierkv_stats_json(client, stats, sizeof stats, &len));
  EXPECT(strstr(stats, "\"hinted_shards\":1") != NULL);
  hint.next_use_ms = -1;
  CHECK(tierkv_weights_hint(client, &hint, 1));
  CHECK(tierkv_stats_json(client, stats, sizeof stats, &len));
  EXPECT(strstr(stats, "\"hinted_shards\":0") != NULL);
  tierkv_weights_hint_item unknown = {"no-model", "c/u8/rank0-of-1", NULL, 1};
  EXPECT(tierkv_weights_hint(client, &unknown, 1) == TIERKV_NOT_FOUND);
  EXPECT(tierkv_weights_hint(client, NULL, 1) == TIERKV_INVALID_ARGUMENT);
  CHECK(tierkv_weights_pin(client, "c-model", "c/u8/rank0-of-1", NULL, 60000));
  CHECK(tierkv_stats_json(client, stats, sizeof stats, &len));
  EXPECT(strstr(stats, "\"pinned_shards\":1") != NULL);
  CHECK(tierkv_weights_pin(client, "c-model", "c/u8/rank0-of-1", &loaded, 0));
  CHECK(tierkv_stats_json(client, stats, sizeof stats, &len));
  EXPECT(strstr(stats, "\"pinned_shards\":0") != NULL);

  uint32_t dropped = 0;
  uint64_t freed = 0;
  CHECK(tierkv_weights_drop(client, "c-model", NULL, NULL, &dropped, &freed));
  EXPECT(dropped == 1 && freed > 0);
  EXPECT(tierkv_weights_drop(client, "c-model", NULL, NULL, NULL, NULL) ==
         TIERKV_NOT_FOUND);
  EXPECT(strstr(tierkv_last_error(), "not_found") != NULL);
  tierkv_client_close(client);
  printf("ok\n");
  return 0;
}
