#include "request_gate.hpp"

#include <charconv>
#include <regex>

#include "kvnode/common/allocator.hpp"

namespace kvnode::httpd {
namespace {

constexpr int kPayloadTooLarge = 413;
constexpr int kMethodNotAllowed = 405;
constexpr int kUnavailable = 503;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// The connection whose request this handler thread is serving: httplib's pre-routing hook sees
// only the request, and it runs on the thread that called process_request.
thread_local Connection* current = nullptr;

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
  const std::string pattern =
      std::regex_replace(path, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  auto wrapped = [this, handler = std::move(handler)](const httplib::Request& req,
                                                      httplib::Response& res) {
    handler(req, res);
    // The answer may take as long to write as a body to read (a handler can wait for workers).
    if (current != nullptr) current->deadline = Clock::now() + limits_.body_timeout;
  };
  if (method == "GET")
    engine_.Get(pattern, std::move(wrapped));
  else
    engine_.Post(pattern, std::move(wrapped));
}

bool RequestGate::process(Connection& c, ConnectionStream& stream, bool last, bool& client_closes) {
  current = &c;
  const bool ok = engine_.process_request(
      stream, last, client_closes, [this, &c](httplib::Request& req) { admit_body(c, req); });
  current = nullptr;
  return ok;
}

// Runs once the headers are read, before the body is.
void RequestGate::admit_body(Connection& c, httplib::Request& req) {
  c.deadline = Clock::now() + limits_.body_timeout;
  const bool chunked = req.get_header_value("Transfer-Encoding") == "chunked";
  if (!req.has_header("Content-Length") && !chunked) return;
  // The APIs take JSON only: a form label (curl -d) would make httplib parse the body as a form
  // and refuse it beyond 8 KB.
  req.headers.erase("Content-Type");
  req.headers.emplace("Content-Type", "application/json");

  std::size_t length = limits_.max_body_bytes;  // a chunked body may grow to the limit
  if (!chunked) {
    const std::string text = req.get_header_value("Content-Length");
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || end != text.data() + text.size()) return;  // httplib answers 400
    length = static_cast<std::size_t>(n);
    c.declared_body = length;
  }
  auto refuse = [&](int status, std::string text) {
    c.refusal_status = status;
    c.refusal_detail = std::move(text);
    c.close_after = true;
    if (!chunked) c.unread_body = length;  // dropped after the answer, so the client reads it
    req.headers.erase("Expect");           // no "100 Continue": the body is not wanted
    refused_.fetch_add(1, std::memory_order_relaxed);
  };
  if (length > limits_.max_body_bytes)
    return refuse(kPayloadTooLarge,
                  "Request body too large (limit " + mib(limits_.max_body_bytes) + ")");
  if (limits_.max_bodies_in_flight_bytes > 0) {
    std::size_t now = in_flight_.load();
    do {
      if (now + length > limits_.max_bodies_in_flight_bytes)
        return refuse(kUnavailable, "request bodies being read are over their budget of " +
                                        mib(limits_.max_bodies_in_flight_bytes) + ": retry later");
    } while (!in_flight_.compare_exchange_weak(now, now + length));
    c.reserved_body = length;
  }
  if (!chunked) req.body.reserve(length);  // one allocation instead of doublings up to 2x
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
  if (c != nullptr && (req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))) {
    c->close_after = true;  // its body is not read as a body: drop it, then close
    c->unread_body = c->declared_body;
    res.set_header("Connection", "close");
  }
  res.set_content(detail("Method Not Allowed"),
                  "application/json");  // FastAPI's words; Allow says more
  return R::Handled;
}

void RequestGate::release(Connection& c) {
  if (c.reserved_body == 0) return;
  in_flight_.fetch_sub(c.reserved_body);
  if (c.reserved_body >= limits_.trim_after_body_bytes)
    release_freed_memory();  // this thread's arena
  c.reserved_body = 0;
}

}  // namespace kvnode::httpd
