// Reads a token file with llm.c's own DataLoader (llmc/dataloader.h), as train_gpt2cu does
// (shuffled, rank 0 of 1), and checks that each batch's inputs and targets are the file's
// token ids (below VOCAB, targets one token on): what bench/gpu/bench.py's dry run runs on
// the token file it writes for llm.c, where the carried llm.c source is there.
//
//   cc -O1 -I LLMC_SRC -o check bench/gpu/llmc_tokens_check.c -lm
//   ./check FILE B T STEPS VOCAB     # prints "ok: ..." and exits 0, or exits 1
#include <stdio.h>
#include <stdlib.h>

#include "llmc/dataloader.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s FILE B T STEPS VOCAB\n", argv[0]);
    return 2;
  }
  const size_t B = (size_t)atol(argv[2]), T = (size_t)atol(argv[3]);
  const int steps = atoi(argv[4]), vocab = atoi(argv[5]);
  DataLoader loader;
  dataloader_init(&loader, argv[1], B, T, 0, 1, 1);
  for (int s = 0; s < steps; s++) {
    dataloader_next_batch(&loader);
    for (size_t i = 0; i < B * T; i++) {
      if (loader.inputs[i] < 0 || loader.inputs[i] >= vocab || loader.targets[i] < 0 ||
          loader.targets[i] >= vocab) {
        fprintf(stderr, "step %d: token %zu is %d (target %d), outside [0, %d)\n", s, i,
                loader.inputs[i], loader.targets[i], vocab);
        return 1;
      }
      if (i + 1 < B * T && loader.targets[i] != loader.inputs[i + 1]) {
        fprintf(stderr, "step %d: target %zu is not the next input\n", s, i);
        return 1;
      }
    }
  }
  printf("ok: llm.c's DataLoader read %zu tokens, %zu batches of %zu x %zu a shard, %d batches "
         "drawn\n", loader.num_tokens, loader.shard_num_samples, B, T, steps);
  dataloader_free(&loader);
  return 0;
}
