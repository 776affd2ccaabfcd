#include "data/tokenizer/bpe_merge.h"

#include <functional>
#include <queue>

namespace plait::data::tokenizer {

void MergeTable::Merge(absl::Span<const int32_t> initial, std::vector<int32_t>& ids) const {
  // The symbols as a linked list; merged-away symbols get id -1.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const int32_t n = static_cast<int32_t>(initial.size());
  if (n == 0) return;
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {initial[i], i - 1, i + 1 < n ? i + 1 : -1};
  // Candidate merges, lowest rank first and, among equal ranks, leftmost first; an entry whose
  // symbols have changed since it was pushed is skipped.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(Key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) {
      queue.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    if (left.id != top.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != top.right_id) continue;
    left.id = top.result;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.left;
    push(left.prev);
    push(top.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace plait::data::tokenizer
