#include "runs.hpp"

#include <algorithm>
#include <numeric>

namespace kvnode::transfer {

Result<Plan> plan_runs(const std::vector<PageCopy>& pages, std::uint32_t local_pages,
                       std::uint32_t remote_pages, bool pull, std::uint32_t max_run) {
  if (pages.empty()) return make_error("no pages to move");
  std::vector<std::uint8_t> written(pull ? local_pages : remote_pages, 0);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const PageCopy& p = pages[i];
    if (p.local >= local_pages)
      return make_error("chunk " + std::to_string(i) + ": local page " + std::to_string(p.local) +
                        " is outside this pool of " + std::to_string(local_pages) + " pages");
    if (p.remote >= remote_pages)
      return make_error("chunk " + std::to_string(i) + ": remote page " + std::to_string(p.remote) +
                        " is outside the peer's pool of " + std::to_string(remote_pages) +
                        " pages");
    const gpu::PageId target = pull ? p.local : p.remote;
    if (written[target]++)
      return make_error("chunk " + std::to_string(i) + ": " + (pull ? "local" : "remote") +
                        " page " + std::to_string(target) + " is written twice");
  }
  Plan plan;
  plan.chunk_order.resize(pages.size());
  std::iota(plan.chunk_order.begin(), plan.chunk_order.end(), 0u);
  std::stable_sort(
      plan.chunk_order.begin(), plan.chunk_order.end(),
      [&](std::uint32_t a, std::uint32_t b) { return pages[a].remote < pages[b].remote; });
  for (std::uint32_t k = 0; k < plan.chunk_order.size(); ++k) {
    const PageCopy& p = pages[plan.chunk_order[k]];
    if (!plan.runs.empty()) {
      Run& last = plan.runs.back();
      if (last.count < max_run && p.local == last.local + last.count &&
          p.remote == last.remote + last.count) {
        ++last.count;
        continue;
      }
    }
    plan.runs.push_back(Run{p.local, p.remote, 1, k});
  }
  return plan;
}

}  // namespace kvnode::transfer
