// Precompiled header for every translation unit that uses libtorch (ATen only: the full
// torch/torch.h costs several times more to parse and we use none of torch::nn).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
