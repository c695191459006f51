// What the backward in progress left in one sub-group's gradient, beside its layout record
// (OptSub): the slices written, the slices lent, the statistics of the final gradient. The
// gradient's hand-over (ingest.cpp, lend.cpp) writes it; drop_grad() resets it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tierswap {

struct SubGrad {
  // Which of the sub-group's parameter slices (OptSub::pids) of the gradient block were written
  // since it was last dropped: an unwritten slice holds zeros, so its first gradient is copied in
  // rather than added (and a whole block's first gradient takes it without zero-filling it
  // first). Sized at layout, one per slice.
  std::vector<char> written;
  bool zero = true;        // nothing written since the last drop
  std::uint32_t seen = 0;  // slices ingested in this backward
  // lend_grad(): slices of the gradient the step reads from the caller's memory, in the
  // accumulation dtype ([b, e) in the group's flat space, one per parameter). Non-empty only
  // while the gradient block holds nothing (zero); all of the slices at step time, or copied
  // into the block first (Impl::materialize_lent).
  struct Lent {
    std::uint64_t b = 0, e = 0;
    const std::byte* data = nullptr;
  };
  std::vector<Lent> lent;
  bool all_lent() const { return !lent.empty() && lent.size() == written.size(); }
  // Statistics chunk sums of the final gradient, taken while it was in memory at ingest (so a
  // gradient spilled to NVMe is not read back for them). Non-empty exactly when the sub-group's
  // gradient is final for this step (gradient_final); any later ingest clears them.
  std::vector<double> sums;
};

}  // namespace tierswap
