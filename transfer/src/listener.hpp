// The first contact between two nodes. A node's Listener is bound at its peer_init_url
// (host:port, what it registers with the controller); a peer dials there with its own
// descriptor (hello) and gets an answer (welcome), each one frame on a ControlLink. Descriptors
// are opaque bytes here (the plane puts the worker address, pool rkey and page geometry in
// them); the data path then connects to the worker address each side learned, and the link
// stays open as the session's liveness channel.
//
// Hostile or broken clients cost little and nothing lasts: a connection that does not start
// with a frame header is closed at once, one that sends no whole hello within hello_timeout is
// closed, at most max_pending wait for their hello at a time (more are accepted and closed),
// and when the process is out of descriptors the listener accepts-and-closes through a reserve
// descriptor (or pauses accepting) instead of spinning, logging once per log_interval.
// Progressed by its owner thread, through progress(); event_fd() is readable when it has work.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "control_link.hpp"

namespace kvnode::transfer {

using LinkId = std::uint64_t;

struct ListenerAnswer {
  LinkBytes body;
  bool keep = true;  // false: a refusal; the link is closed once it is sent
};

struct ListenerHooks {
  // The answer to a peer's hello on link `link`, open until drop() or lost().
  std::function<ListenerAnswer(const LinkBytes& hello, LinkId link)> answer;
  // An answered link ended (the peer is gone, or broke the protocol); the listener has closed it.
  std::function<void(LinkId link, const std::string& why)> lost;
};

struct ListenerLimits {
  std::size_t max_pending = 64;  // connections waiting for their hello; at most 1/4 of ulimit -n
  std::chrono::milliseconds hello_timeout{5000};
  std::chrono::milliseconds log_interval{10'000};  // refusals and drops are logged this often
  std::chrono::milliseconds accept_pause{100};     // out of descriptors, without a reserve
};

struct ListenerCounters {
  std::uint64_t accepted = 0;
  std::uint64_t handshakes = 0;
  std::uint64_t dropped = 0;  // closed before a valid hello: junk, too slow, closed early
  std::uint64_t refused = 0;  // closed at accept: too many pending, or out of descriptors
  std::uint64_t out_of_descriptors = 0;  // of those, refused for want of a descriptor
};

class Listener {
 public:
  // port 0 picks a free one (see port()).
  static Result<std::unique_ptr<Listener>> bind(const std::string& host, std::uint16_t port,
                                                ListenerHooks hooks, ListenerLimits limits = {});
  // Answers every hello with the same descriptor.
  static Result<std::unique_ptr<Listener>> bind(const std::string& host, std::uint16_t port,
                                                LinkBytes descriptor);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener();

  std::uint16_t port() const { return port_; }
  int event_fd() const { return epoll_.fd(); }
  // Accepts, reads hellos, answers, notices lost links; returns events handled.
  unsigned progress();
  std::size_t handshakes() const { return counters_.handshakes; }
  const ListenerCounters& counters() const { return counters_; }
  // Closes one answered link (the plane ended that peer's session).
  void drop(LinkId link);

 private:
  struct Conn {
    ControlLink link;
    std::chrono::steady_clock::time_point deadline;  // for the hello
    bool answered = false;
    bool closing = false;  // a refusal: closed once sent
  };
  Listener(Epoll epoll, UniqueFd socket, ListenerHooks hooks, ListenerLimits limits);
  unsigned accept_all();
  bool out_of_descriptors();  // true: stop accepting for now (none waits, or paused)
  unsigned serve(LinkId id);
  void close(LinkId id, bool report, const std::string& why);
  void note_drop(const std::string& why);
  void log_now_and_then();
  std::size_t pending() const;

  Epoll epoll_;
  UniqueFd socket_;
  UniqueFd reserve_;  // closed to accept-and-close one connection when out of descriptors
  ListenerHooks hooks_;
  ListenerLimits limits_;
  std::uint16_t port_ = 0;
  std::map<LinkId, Conn> conns_;
  LinkId next_id_ = 1;
  bool paused_ = false;
  std::chrono::steady_clock::time_point resume_at_;
  ListenerCounters counters_;
  ListenerCounters logged_;  // what the last log line covered
  std::chrono::steady_clock::time_point next_log_;
  std::string last_drop_;
};

// Connects to host:port, sends `descriptor`, returns the listener's answer (blocking, until the
// deadline).
Result<LinkBytes> handshake(const std::string& host, std::uint16_t port,
                            const LinkBytes& descriptor,
                            std::chrono::steady_clock::time_point deadline);

}  // namespace kvnode::transfer
