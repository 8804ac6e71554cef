// Issue 19 item 5 at the registry: workers that never heartbeat are due for a probe once
// worker_timeout has passed since they registered (or last answered one), a refused probe
// removes them, an answered one keeps them; at most max_workers are registered.
#include <gtest/gtest.h>

#include <chrono>

#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {
namespace {

wire::RegisterMsg reg(std::string inst, std::int64_t port) {
  return wire::RegisterMsg{std::move(inst), 0, "127.0.0.1", port, std::nullopt};
}

std::vector<ProbeOutcome> outcomes(const std::vector<WorkerEndpoint>& due, bool reachable) {
  std::vector<ProbeOutcome> out;
  for (const auto& ep : due) out.push_back(ProbeOutcome{ep, reachable});
  return out;
}

TEST(WorkerLiveness, UnconfirmedWorkersAreProbedFromRegistration) {
  Registry r(RegistryOptions{.worker_timeout = 30.0});
  r.register_worker(reg("quiet", 1), 0.0);
  r.register_worker(reg("beats", 2), 0.0);
  r.heartbeat(wire::HeartbeatMsg{"beats", 0, "127.0.0.1", 2, std::nullopt}, 10.0);
  EXPECT_TRUE(r.unconfirmed(29.0, 100).empty());
  auto due = r.unconfirmed(31.0, 100);
  ASSERT_EQ(due.size(), 1u);  // the heartbeating one follows its heartbeats instead
  EXPECT_EQ(due[0].instance_id, "quiet");
  // Its port answered: seen now, not due again for worker_timeout.
  EXPECT_TRUE(r.settle_probes(outcomes(due, true), 31.0).empty());
  EXPECT_TRUE(r.unconfirmed(60.0, 100).empty());
  due = r.unconfirmed(62.0, 100);
  ASSERT_EQ(due.size(), 1u);
  // Refused: removed with its instance.
  auto gone = r.settle_probes(outcomes(due, false), 62.0);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].instance_id, "quiet");
  EXPECT_FALSE(r.has_instance("quiet"));
  EXPECT_TRUE(r.has_instance("beats"));
}

TEST(WorkerLiveness, AProbeOfAnEarlierRegistrationSaysNothing) {
  Registry r(RegistryOptions{.worker_timeout = 30.0});
  r.register_worker(reg("w", 1), 0.0);
  auto due = r.unconfirmed(31.0, 100);
  ASSERT_EQ(due.size(), 1u);
  r.register_worker(reg("w", 5), 32.0);  // restarted at a new port while the probe ran
  EXPECT_TRUE(r.settle_probes(outcomes(due, false), 33.0).empty());
  EXPECT_TRUE(r.has_instance("w"));
  due = r.unconfirmed(33.0, 100);
  EXPECT_TRUE(due.empty());
  // And one that heartbeated meanwhile has a heartbeat contract: the reaper's, not the probe's.
  due = r.unconfirmed(63.0, 100);
  ASSERT_EQ(due.size(), 1u);
  r.heartbeat(wire::HeartbeatMsg{"w", 0, "127.0.0.1", 5, std::nullopt}, 63.5);
  EXPECT_TRUE(r.settle_probes(outcomes(due, false), 64.0).empty());
  EXPECT_TRUE(r.has_instance("w"));
}

TEST(WorkerLiveness, AFloodOfRegistrationsIsReapedInBoundedRounds) {
  Registry r(RegistryOptions{.worker_timeout = 30.0});
  constexpr int kFlood = 50'000;
  for (int i = 0; i < kFlood; ++i) r.register_worker(reg("flood-" + std::to_string(i), 1), 0.0);
  EXPECT_EQ(r.stats().workers, std::size_t{kFlood});
  const auto start = std::chrono::steady_clock::now();
  std::size_t rounds = 0, reaped = 0;
  for (auto due = r.unconfirmed(31.0, 4096); !due.empty(); due = r.unconfirmed(31.0, 4096)) {
    EXPECT_LE(due.size(), 4096u);
    reaped += r.settle_probes(outcomes(due, false), 31.0).size();
    ++rounds;
  }
  EXPECT_EQ(reaped, std::size_t{kFlood});
  EXPECT_EQ(rounds, std::size_t{(kFlood + 4095) / 4096});
  EXPECT_EQ(r.stats().workers, 0u);
  EXPECT_EQ(r.stats().instances, 0u);
  // One erase per worker over the instance list took seconds; one pass per round takes little.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(WorkerLimit, RefusesNewWorkersBeyondMaxWorkersAndNamesTheLimit) {
  Registry r(RegistryOptions{.max_workers = 2});
  EXPECT_EQ(r.refusal("a", 0), std::nullopt);
  r.register_worker(reg("a", 1), 0.0);
  r.register_worker(reg("b", 2), 0.0);
  const auto why = r.refusal("c", 0);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("--max-workers is 2"), std::string::npos) << *why;
  EXPECT_NE(why->find("c/0"), std::string::npos) << *why;
  EXPECT_EQ(r.refusal("a", 0), std::nullopt);  // a known worker may re-register
  EXPECT_TRUE(r.refusal("a", 1));              // another rank is another worker
  r.deregister("b", 0);
  EXPECT_EQ(r.refusal("c", 0), std::nullopt);
}

}  // namespace
}  // namespace kvnode::controller
