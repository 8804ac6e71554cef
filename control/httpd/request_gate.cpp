#include "request_gate.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string_view>

#include "kvnode/common/allocator.hpp"

namespace kvnode::httpd {
namespace {

constexpr int kBadRequest = 400;
constexpr int kNotFound = 404;
constexpr int kLengthRequired = 411;
constexpr int kPayloadTooLarge = 413;
constexpr int kRequestTimeout = 408;
constexpr int kUnsupportedMediaType = 415;
constexpr int kMethodNotAllowed = 405;
constexpr int kUnavailable = 503;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kKiB = std::size_t{1} << 10;
// Chunk-size lines and trailers a chunked body may add to its bytes on the wire.
constexpr std::size_t kChunkFramingSlack = 64 * kKiB;
// How long a body may wait for the budget (other bodies finishing) before it is refused.
constexpr auto kBudgetPatience = std::chrono::seconds(5);
// A body's first buffer (or its length, if smaller): charged when its headers are admitted. Most
// bodies fit; larger ones double from here as their bytes arrive.
constexpr std::size_t kFirstBodyBuffer = 64 * kKiB;

// Digits only: httplib's strtoull would also take "+5", " 5" and "5x".
std::optional<std::size_t> parse_length(const std::string& text) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return static_cast<std::size_t>(n);
}

std::string lower(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

// Restores `current` however process_request ends (it may throw).
struct CurrentGuard {
  explicit CurrentGuard(Connection& c);
  ~CurrentGuard();
  CurrentGuard(const CurrentGuard&) = delete;
  CurrentGuard& operator=(const CurrentGuard&) = delete;
};

// The connection whose request this handler thread is serving: httplib's pre-routing hook sees
// only the request, and it runs on the thread that called process_request.
thread_local Connection* current = nullptr;

CurrentGuard::CurrentGuard(Connection& c) {
  current = &c;
}
CurrentGuard::~CurrentGuard() {
  current = nullptr;
}

std::string detail(const std::string& text) {
  return R"({"detail":")" + text + R"("})";  // texts here are ours: no quotes to escape
}

std::string mib(std::size_t bytes) {
  return std::to_string(bytes / kMiB) + " MiB";
}

}  // namespace

RequestGate::RequestGate(Engine& engine, const Limits& limits) : engine_(engine), limits_(limits) {
  engine_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return before_routing(req, res);
  });
}

void RequestGate::route(const std::string& method, const std::string& path,
                        Server::Handler handler) {
  methods_[path].insert(method);
  if (method == "GET") methods_[path].insert("HEAD");  // httplib answers HEAD from GET handlers
  // httplib matches patterns as regular expressions; ours are exact paths.
  // Escaped by hand: std::regex here trips GCC 12's -Wmaybe-uninitialized under the sanitizers.
  std::string pattern;
  for (const char ch : path) {
    if (std::string_view(".^$|()[]{}*+?\\").find(ch) != std::string_view::npos) pattern += '\\';
    pattern += ch;
  }
  if (method == "GET") {
    engine_.Get(pattern, [this, handler = std::move(handler)](const httplib::Request& req,
                                                              httplib::Response& res) {
      handler(req, res);
      // The answer may take as long to write as a body to read (a handler can wait for workers).
      if (current != nullptr) current->deadline = Clock::now() + limits_.body_timeout;
    });
    return;
  }
  // httplib hands a content reader, not the body: the body is read here, under the budget.
  auto post = [this, handler = std::move(handler)](const httplib::Request& req,
                                                   httplib::Response& res,
                                                   const httplib::ContentReader& reader) {
    if (current != nullptr) serve_post(*current, handler, req, res, reader);
  };
  engine_.Post(pattern, httplib::Server::HandlerWithContentReader(std::move(post)));
}

std::size_t body_handler_threads(const Limits& limits) {
  const std::size_t all = std::max<std::size_t>(limits.handler_threads, 1);
  if (limits.body_handler_threads > 0) return std::min(limits.body_handler_threads, all);
  return std::max<std::size_t>(all - 1, 1);  // one thread is kept for requests without a body
}

std::size_t peak_body_bytes(std::size_t length) {
  std::size_t step = kFirstBodyBuffer;  // the buffers a body of `length` passes through
  while (2 * step < length) step *= 2;
  return length <= kFirstBodyBuffer ? length : step + length;
}

void RequestGate::serve_post(Connection& c, const Server::Handler& handler,
                             const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& reader) {
  std::string body;
  // A body not read whole is freed, and its budget back, before the answer is written: a client
  // that has the answer finds the budget back.
  auto give_up = [&] {
    std::string().swap(body);
    return_budget(c);
  };
  try {
    if (!read_body(c, reader, body, res)) return give_up();
  } catch (...) {
    // Out of memory or a fault mid-body (httplib answers 500): the rest of the body is unread,
    // so the connection ends after the answer, and the answer says so.
    c.close_after = true;
    res.set_header("Connection", "close");
    give_up();
    throw;
  }
  {
    httplib::Request with_body = req;  // httplib's is const
    with_body.body = std::move(body);
    handler(with_body, res);
  }
  // The body is handled and freed: its budget comes back before the answer is written, so a
  // client that has the answer finds the budget back.
  return_budget(c);
  // The answer may take as long to write as a body to read (a handler can wait for workers).
  c.deadline = Clock::now() + limits_.body_timeout;
}

bool RequestGate::process(Connection& c, ConnectionStream& stream, bool last, bool& client_closes) {
  const CurrentGuard guard(c);
  return engine_.process_request(stream, last, client_closes,
                                 [this, &c](httplib::Request& req) { admit_body(c, req); });
}

// Runs once the headers are read, before the body is.
void RequestGate::admit_body(Connection& c, httplib::Request& req) {
  c.deadline = Clock::now() + limits_.body_timeout;
  // Everything read from here on is body: counted, capped and held to a minimum rate.
  c.body_started = true;
  c.body_start = Clock::now();
  c.body_read = 0;
  c.body_cap = 0;
  c.min_body_bytes_per_second = limits_.min_body_bytes_per_second;
  c.body_grace = limits_.body_grace;
  // httplib compares Transfer-Encoding case-insensitively (and reads a body whatever the method).
  const std::string encoding = lower(req.get_header_value("Transfer-Encoding"));
  const bool chunked = encoding.find("chunked") != std::string::npos;
  const bool has_length = req.has_header("Content-Length");
  // httplib reads a body for these methods only (and never a GET's: it would be parsed as the
  // next request).
  const bool reads_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                          req.method == "DELETE" || req.method == "PRI";
  auto refuse = [&](int status, std::string text, std::size_t unread) {
    c.refusal_status = status;
    c.refusal_detail = std::move(text);
    c.close_after = true;
    c.unread_body = unread;       // dropped after the answer, so the client reads it
    req.headers.erase("Expect");  // no "100 Continue": the body is not wanted
    if (status != kNotFound) refused_.fetch_add(1, std::memory_order_relaxed);
  };
  if (!reads_body) {
    if (has_length || chunked) {
      c.close_after = true;
      c.unread_body = parse_length(req.get_header_value("Content-Length")).value_or(0);
    }
    return;
  }
  const auto known = methods_.find(req.path);
  if (!has_length && !chunked) {
    // httplib would read until the client closes, uncounted. A method the path does not take
    // is answered 405 before any body is read.
    if (known == methods_.end()) return refuse(kNotFound, "Not Found", 0);
    if (known->second.count(req.method) != 0)
      return refuse(kLengthRequired, "a request body needs Content-Length", 0);
    return;
  }
  const std::string coding = lower(req.get_header_value("Content-Encoding"));
  if (!coding.empty() && coding != "identity")  // httplib would inflate it past every limit
    return refuse(kUnsupportedMediaType, "Content-Encoding " + coding + " is not accepted", 0);
  // The APIs take JSON only: a form label (curl -d) would make httplib parse the body as a form
  // and refuse it beyond 8 KB.
  req.headers.erase("Content-Type");
  req.headers.emplace("Content-Type", "application/json");

  std::size_t length = limits_.max_body_bytes;  // a chunked body may grow to the limit
  if (chunked) {
    c.close_after = true;  // whether it was read to its end is httplib's secret
    c.body_cap = limits_.max_body_bytes + limits_.max_body_bytes / 16 + kChunkFramingSlack;
  } else {
    // Digits only: httplib's strtoull would take "+5" and "5x" where we could not.
    const auto n = parse_length(req.get_header_value("Content-Length"));
    if (!n) return refuse(kBadRequest, "malformed Content-Length", 0);
    length = *n;
    c.declared_body = length;
  }
  const std::size_t unread = chunked ? 0 : length;
  if (length > limits_.max_body_bytes)
    return refuse(kPayloadTooLarge,
                  "Request body too large (limit " + mib(limits_.max_body_bytes) + ")", unread);
  // Only our routes read a body (under the budget): httplib would read one for a 404 uncounted.
  if (known == methods_.end()) return refuse(kNotFound, "Not Found", unread);
  // The first buffer only: the rest is charged as the body arrives (make_room).
  if (!charge(c, std::min(length, kFirstBodyBuffer)))
    return refuse(kUnavailable, over_budget(), unread);
}

std::string RequestGate::over_budget() const {
  return "request bodies being read are over their budget of " +
         mib(limits_.max_bodies_in_flight_bytes) + ": retry later";
}

bool RequestGate::read_body(Connection& c, const httplib::ContentReader& reader, std::string& body,
                            httplib::Response& res) {
  const bool whole = reader([&](const char* data, std::size_t n) {
    if (!make_room(c, body, n)) return false;
    body.append(data, n);
    return true;
  });
  if (whole) return true;
  // httplib has set 400 whatever went wrong: say what did. The connection closes after the
  // answer (the stream is out of step); a refused body is drained first so the client reads it.
  c.close_after = true;
  int status = kBadRequest;
  std::string text = "request body incomplete or malformed";
  if (c.refusal_status != 0) {
    status = c.refusal_status;
    text = c.refusal_detail;
  } else if (c.timed_out) {
    status = kRequestTimeout;
    text = "request body not received in time (" +
           std::to_string(limits_.body_timeout.count() / 1000) + " s in all, at least " +
           std::to_string(limits_.min_body_bytes_per_second / kKiB) + " KiB/s after " +
           std::to_string(limits_.body_grace.count() / 1000) + " s)";
  } else if (c.body_cap > 0 && c.body_read > c.body_cap) {
    status = kPayloadTooLarge;
    text = "Request body too large (limit " + mib(limits_.max_body_bytes) + ")";
  }
  res.status = status;
  res.set_header("Connection", "close");
  res.set_content(detail(text), "application/json");
  return false;
}

bool RequestGate::make_room(Connection& c, std::string& body, std::size_t more) {
  const std::size_t needed = body.size() + more;
  if (needed <= body.capacity()) return true;
  // A Content-Length bounds the body (httplib reads no more); a chunked one may grow to the limit.
  const std::size_t bound = c.declared_body > 0 ? c.declared_body : limits_.max_body_bytes;
  if (needed > bound) {
    c.refusal_status = kPayloadTooLarge;
    c.refusal_detail = "Request body too large (limit " + mib(limits_.max_body_bytes) + ")";
    refused_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Doubling: a body holds at most twice what it received and is copied about once in all.
  const std::size_t target =
      std::min(bound, std::max({needed, 2 * body.capacity(), kFirstBodyBuffer}));
  // Both buffers exist while the bytes are copied: both are charged until the old one is freed.
  const std::size_t held = body.empty() ? 0 : body.capacity();  // an empty string has no heap
  if (held + target > c.budget.bytes && !charge(c, held + target - c.budget.bytes)) {
    c.refusal_status = kUnavailable;
    c.refusal_detail = over_budget();
    refused_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (faults_.body_buffer) faults_.body_buffer(target);
  std::string bigger;
  bigger.reserve(target);
  bigger.append(body);
  body.swap(bigger);
  std::string().swap(bigger);  // frees the old buffer
  uncharge(c, c.budget.bytes - target);
  return true;
}

bool RequestGate::charge(Connection& c, std::size_t bytes) {
  const auto asked = Clock::now();
  const bool taken = budget_.charge(c.budget, bytes, std::min(c.deadline, asked + kBudgetPatience));
  // Time spent waiting for the budget is the server's, not the client's: not held against its
  // minimum rate.
  c.body_grace += std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - asked);
  return taken;
}

void RequestGate::uncharge(Connection& c, std::size_t bytes) {
  budget_.release(c.budget, bytes);
}

httplib::Server::HandlerResponse RequestGate::before_routing(const httplib::Request& req,
                                                             httplib::Response& res) {
  using R = httplib::Server::HandlerResponse;
  Connection* c = current;
  const auto known = methods_.find(req.path);
  if (known == methods_.end() || known->second.count(req.method) != 0) {
    if (c == nullptr || c->refusal_status == 0) return R::Unhandled;
    res.status = c->refusal_status;
    res.set_header("Connection", "close");
    res.set_content(detail(c->refusal_detail), "application/json");
    return R::Handled;
  }
  std::string allowed;
  for (const std::string& m : known->second) allowed += (allowed.empty() ? "" : ", ") + m;
  res.status = kMethodNotAllowed;
  res.set_header("Allow", allowed);
  if (c != nullptr && (c->declared_body > 0 || req.has_header("Transfer-Encoding"))) {
    c->close_after = true;  // its body is not read as a body: drop it, then close
    c->unread_body = c->declared_body;
    res.set_header("Connection", "close");
  }
  res.set_content(detail("Method Not Allowed"),
                  "application/json");  // FastAPI's words; Allow says more
  return R::Handled;
}

void RequestGate::return_budget(Connection& c) {
  uncharge(c, c.budget.bytes);
}

void RequestGate::release(Connection& c) {
  return_budget(c);
  if (std::max(c.declared_body, c.body_read) >= limits_.trim_after_body_bytes)
    release_freed_memory();  // this thread's arena
}

}  // namespace kvnode::httpd
