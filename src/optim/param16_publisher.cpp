// Param16Publisher: the trainer's callback and the bound device copies of the 16-bit parameters.
#include "src/optim/param16_publisher.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "tierswap/cuda_runtime.hpp"
#include "tierswap/log.hpp"

namespace tierswap {

Param16Publisher::~Param16Publisher() {
  for (const void* p : registered_) cuda::host_unregister(const_cast<void*>(p));
}

void Param16Publisher::configure(bool device_memory, int world) noexcept {
  device_memory_ = device_memory;
  world_ = world;
}

void Param16Publisher::register_group(const OptGroup& g) {
  if (!cuda::available() || g.p16.empty()) return;
  void* p = const_cast<std::uint16_t*>(g.p16.data());
  if (cuda::host_register(p, g.p16.size() * sizeof(std::uint16_t)))
    registered_.push_back(p);
  else
    log(LogLevel::info, fmt::format("finalize: could not page-lock the 16-bit parameters of group "
                                    "'{}'; copies to the GPU will be staged",
                                    g.name));
}

void Param16Publisher::forget_group(const OptGroup& g) noexcept {
  const auto it =
      std::find(registered_.begin(), registered_.end(), static_cast<const void*>(g.p16.data()));
  if (it == registered_.end()) return;
  cuda::host_unregister(const_cast<void*>(*it));
  registered_.erase(it);
}

void Param16Publisher::bind(ParamId id, void* d16) {
  if (bound_.size() <= id) bound_.resize(params_.size(), nullptr);
  bound_[id] = d16;
  if (d16 == nullptr) return;
  const OptParam& p = params_[id];
  put(id, p.offset, p.offset + p.numel);
  sync();
}

void Param16Publisher::put(ParamId id, std::uint64_t b, std::uint64_t e) {
  const OptParam& q = params_[id];
  auto* dst = static_cast<std::uint16_t*>(bound_[id]) + (b - q.offset);
  const std::uint16_t* src = groups_[q.group].p16.data() + b;
  if (device_memory_) {
    cuda::copy_to_device(dst, src, (e - b) * sizeof(std::uint16_t), nullptr);
    pending_ = true;
  } else {
    std::memcpy(dst, src, (e - b) * sizeof(std::uint16_t));
  }
}

void Param16Publisher::begin() {
  left_.resize(params_.size());
  for (std::size_t id = 0; id < params_.size(); ++id) left_[id] = params_[id].nsubs;
  from_device_.assign(subs_.size(), 0);
}

bool Param16Publisher::copied_from_device(const OptSub& s) const noexcept {
  const std::size_t k = index_of(s);
  return k < from_device_.size() && from_device_[k] != 0;
}

void Param16Publisher::done(const OptSub& s) {
  if (world_ > 1) return;
  const bool copy = !copied_from_device(s);
  for (ParamId id : s.pids) {
    const OptParam& p = params_[id];
    if (copy && id < bound_.size() && bound_[id] != nullptr) {
      const auto [b, e] = slice(p, s);
      put(id, b, e);
    }
    if (ready_ && id < left_.size() && left_[id] > 0 && --left_[id] == 0)
      ready_(id, {groups_[p.group].p16.data() + p.offset, p.numel});
  }
}

void Param16Publisher::fill_bound() {
  for (std::size_t id = 0; id < bound_.size(); ++id)
    if (bound_[id] != nullptr) {
      const OptParam& p = params_[id];
      put(static_cast<ParamId>(id), p.offset, p.offset + p.numel);
    }
}

void Param16Publisher::refill() {
  fill_bound();
  sync();
}

void Param16Publisher::all() {
  fill_bound();
  if (!ready_) return;
  for (std::size_t id = 0; id < params_.size(); ++id) {
    const OptParam& p = params_[id];
    if (p.spec.requires_grad)
      ready_(static_cast<ParamId>(id), {groups_[p.group].p16.data() + p.offset, p.numel});
  }
}

void Param16Publisher::from_device(const OptSub& s, const std::uint16_t* out,
                                   const std::vector<char>* left_alone) {
  for (ParamId id : s.pids) {
    if (id >= bound_.size() || bound_[id] == nullptr) continue;
    if (left_alone != nullptr && (*left_alone)[id] != 0) continue;
    const OptParam& q = params_[id];
    const auto [b, e] = slice(q, s);
    cuda::copy_on_device(static_cast<std::uint16_t*>(bound_[id]) + (b - q.offset),
                         out + (b - s.begin), (e - b) * sizeof(std::uint16_t), nullptr);
  }
  const std::size_t k = index_of(s);
  if (from_device_.size() <= k) from_device_.resize(subs_.size(), 0);
  from_device_[k] = 1;
}

void Param16Publisher::sync() {
  if (!pending_) return;
  pending_ = false;
  cuda::synchronize(nullptr);
}

}  // namespace tierswap
