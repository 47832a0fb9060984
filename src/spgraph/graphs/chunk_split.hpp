// The split rule of a step into chunks, in one place: the scheduler (PrefillScheduler::schedule)
// and the executor's run(step) both cut a step's requests with it (docs/graphs.md, "Steps").
//
// Requests are taken in order. A request's first piece goes into the open chunk (the last one)
// while that chunk holds fewer than R requests and fewer than T tokens, taking what is left of
// its T tokens; every further piece opens a fresh chunk of up to T tokens (a request never
// appears twice in one chunk). So a request's tokens in a step are contiguous and may continue
// from one chunk into the next, and the chunks must run in order.
#pragma once

namespace spg::graphs {

/// @brief The chunk limits of a split: R, T, and an optional cap on chunks per step.
struct ChunkLimits {
  int max_requests{1};  ///< R
  int max_tokens{1};    ///< T
  int max_chunks{0};    ///< 0: no cap
};

/// @brief Where a split stands: chunks opened so far, and the last one's requests and tokens.
struct SplitCursor {
  int chunks{0};
  int requests{0};
  int tokens{0};
};

/// @brief One piece of a request: its tokens, and whether it opens a fresh chunk.
struct ChunkPiece {
  bool new_chunk{false};
  int tokens{0};  ///< 0: the cap on chunks is reached, the request gets no more tokens
};

/// True when the cursor's last chunk can take no further request (none open, R requests or T tokens).
[[nodiscard]] constexpr bool chunk_full(const ChunkLimits& l, const SplitCursor& at) noexcept {
  return at.chunks == 0 || at.requests >= l.max_requests || at.tokens >= l.max_tokens;
}

/// The next piece of a request with `left` tokens (>= 1) still to place. `continuing`: the request
/// already has a piece in this split, so this one opens a fresh chunk.
[[nodiscard]] constexpr ChunkPiece next_piece(const ChunkLimits& l, const SplitCursor& at, int left,
                                              bool continuing) noexcept {
  if (!continuing && !chunk_full(l, at)) {
    return ChunkPiece{false, left < l.max_tokens - at.tokens ? left : l.max_tokens - at.tokens};
  }
  if (l.max_chunks > 0 && at.chunks >= l.max_chunks) return ChunkPiece{true, 0};
  return ChunkPiece{true, left < l.max_tokens ? left : l.max_tokens};
}

/// Moves the cursor past a placed piece (tokens >= 1).
constexpr void advance(SplitCursor& at, const ChunkPiece& p) noexcept {
  if (p.new_chunk) {
    ++at.chunks;
    at.requests = 0;
    at.tokens = 0;
  }
  ++at.requests;
  at.tokens += p.tokens;
}

/// The most chunks a step of at most `requests` requests and `tokens` tokens can split into: a
/// chunk is opened by a request's first piece (at most `requests`) or by a continuation, which
/// follows a chunk filled to T tokens (at most tokens / T); and every chunk holds a token.
[[nodiscard]] constexpr int max_split_chunks(int requests, int tokens, int max_tokens) noexcept {
  const long long bound = static_cast<long long>(requests) + tokens / max_tokens;
  return static_cast<int>(bound < tokens ? bound : tokens);
}

}  // namespace spg::graphs
