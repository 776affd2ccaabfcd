// The keys and values a model's attention layers computed for the tokens of a batch of rows
// so far, so that decoding the next token computes that token alone (CausalLM::Decode). Rows
// of different lengths are left-padded: row r's first pads[r] tokens are padding, which no
// token attends, and its tokens' positions count from 0 after them; every row writes its
// tokens at the same index of the cache. Each layer's keys and values take memory at their
// first use, for `capacity` tokens a row, with the heads and dtype the layer computes (a
// tensor-parallel rank's own key/value heads).
//
//   KvCache cache(pads, prompt_len + max_new_tokens);
//   at::Tensor logits = model->Decode(prompts, cache);  // [B, T, V]: every prompt token's
//   at::Tensor next = model->Decode(sampled, cache);    // [B, 1, V]: the sampled tokens'
#ifndef PLAIT_MODELS_KV_CACHE_H_
#define PLAIT_MODELS_KV_CACHE_H_

#include <cstdint>
#include <map>
#include <utility>

#include "ATen/core/Tensor.h"

namespace plait::models {

class KvCache {
 public:
  // For pads.size(0) rows (int64 [B], on the host) of up to `capacity` tokens each.
  KvCache(at::Tensor pads, int64_t capacity);

  int64_t rows() const { return pads_.size(0); }
  int64_t capacity() const { return capacity_; }
  // The tokens written so far in every row, padding included.
  int64_t length() const { return length_; }
  // Bytes the layers' keys and values hold.
  int64_t bytes() const;

  // The positions of the next `count` tokens of each row, int64 [B, count] on `device`: their
  // index less the row's padding (0 for padding).
  at::Tensor Positions(int64_t count, const at::Device& device) const;
  // The additive mask of the next `count` tokens' attention, [B, count, length() + count] of
  // `dtype` on `device`: 0 where a token meets a key (its row's tokens up to itself, padding
  // left out; a padding token meets itself alone), -inf elsewhere.
  at::Tensor Mask(int64_t count, at::ScalarType dtype, const at::Device& device) const;

  // Writes layer `layer`'s keys and values of the next tokens, k and v [B, T, KV, d], and
  // returns all its keys and values so far, [B, KV, length() + T, d] each: views of the
  // cache, held heads first, in which each head's keys (values) are rows of one matrix.
  std::pair<at::Tensor, at::Tensor> Append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Counts `count` more tokens written, once every layer has appended them.
  void Advance(int64_t count);

 private:
  at::Tensor pads_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> layers_;
};

}  // namespace plait::models

#endif  // PLAIT_MODELS_KV_CACHE_H_
