// Publishing the 16-bit parameters a step produced (ShardedOptimizer): the trainer's callback as
// each parameter's new values become final (on_param16_ready) and the device copies it bound
// (bind_param16_device), kept equal to param16(). The publisher owns the callback, the bound
// pointers, the sub-groups each parameter still waits for in this step, the page-locked 16-bit
// buffers and the copies in flight; it reads the layout and never changes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/optim/layout.hpp"
#include "tierswap/optimizer.hpp"

namespace tierswap {

class Param16Publisher {
 public:
  /// The optimizer's layout, read as it grows (a group added between steps).
  Param16Publisher(const std::vector<OptGroup>& groups, const std::vector<OptParam>& params,
                   const std::vector<OptSub>& subs) noexcept
      : groups_(groups), params_(params), subs_(subs) {}
  ~Param16Publisher();  // unregisters the page-locked buffers
  Param16Publisher(const Param16Publisher&) = delete;
  Param16Publisher& operator=(const Param16Publisher&) = delete;

  /// finalize(): whether bound pointers are GPU memory (else host memory standing in for it, a
  /// simulated device tier) and the world size (above 1, values are final only after the
  /// all-gather: all()).
  void configure(bool device_memory, int world) noexcept;
  bool device_memory() const noexcept { return device_memory_; }
  void on_ready(ShardedOptimizer::Param16Ready fn) { ready_ = std::move(fn); }
  /// Page-locks g's 16-bit values for copies to the GPU (when one is usable; logged when it
  /// fails); forget_group() undoes it (a group added between steps and taken back).
  void register_group(const OptGroup& g);
  void forget_group(const OptGroup& g) noexcept;
  /// Binds trainable parameter id's device copy (null unbinds) and fills it, waiting for the copy.
  void bind(ParamId id, void* d16);

  /// A step starts: every parameter waits for its sub-groups.
  void begin();
  /// s stepped (world size 1): its slices of the bound copies filled (unless from_device() did),
  /// and the callback for each parameter now final.
  void done(const OptSub& s);
  /// Every bound copy filled and the callback for every trainable parameter (a step at world
  /// size > 1 after its gather, a rollback).
  void all();
  /// Every bound copy filled, waiting for the copies (new state: initialize(), load(), resume()).
  void refill();
  /// A GPU step's final output for s (`out`, device memory, s.numel values) copied to the bound
  /// copies device to device, skipping the parameters `left_alone` marks (null: none); done(s)
  /// then copies nothing for s.
  void from_device(const OptSub& s, const std::uint16_t* out, const std::vector<char>* left_alone);
  /// Waits for the copies to GPU memory issued (on the calling thread's stream).
  void sync();

 private:
  void put(ParamId id, std::uint64_t b, std::uint64_t e);
  void fill_bound();
  std::size_t index_of(const OptSub& s) const noexcept {
    return static_cast<std::size_t>(&s - subs_.data());
  }
  bool copied_from_device(const OptSub& s) const noexcept;

  const std::vector<OptGroup>& groups_;
  const std::vector<OptParam>& params_;
  const std::vector<OptSub>& subs_;
  ShardedOptimizer::Param16Ready ready_;
  std::vector<void*> bound_;             // by ParamId (shorter: the rest unbound)
  std::vector<std::uint32_t> left_;      // by ParamId: sub-groups not yet stepped in this step
  std::vector<char> from_device_;        // by sub-group: this step's copies done by from_device()
  std::vector<const void*> registered_;  // page-locked (cuda::host_register)
  bool device_memory_ = false;
  bool pending_ = false;  // copies to GPU memory issued and not yet waited for
  int world_ = 1;
};

}  // namespace tierswap
