#include "kvnode/controller/http_api.hpp"

#include <httplib.h>

#include <charconv>
#include <functional>

#include "http_json.hpp"
#include "kvnode/httpd/metrics.hpp"
#include "kvnode/wire/json.hpp"
#include "orch_uuid.hpp"

namespace kvnode::controller {

namespace {

using http::Json;

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

Reply fail(int status, std::string_view text) {
  return Reply{status, http::detail(text)};
}
// A request that fails validation: 422 with FastAPI's list of errors.
Reply invalid(const http::FieldError& e) {
  Json j = Json::object();
  j["detail"] = Json::array({e.to_json()});
  return Reply{422, http::dump(j)};
}
Reply ok(const Json& json) {
  return Reply{200, http::dump(json)};
}

// An orchestrator reply in LMCache's JSON: the message's fields without "type".
Reply from_orch(const OrchReply& r) {
  if (const auto* e = std::get_if<wire::ErrorMsg>(&r.reply))
    return fail(r.http_status >= 400 ? r.http_status : 500, e->error);
  Json j = wire::to_builtins(r.reply);
  j.erase("type");
  return ok(j);
}

// LMCache's WorkerInfoResponse: WorkerInfo's fields as msgspec's to_builtins gives them, then
// key_count.
Json worker_listing_json(std::vector<Registry::WorkerListing> listing) {
  std::vector<wire::WorkerInfo> infos;
  for (const Registry::WorkerListing& l : listing) infos.push_back(l.info);
  Json j = wire::to_builtins(wire::QueryWorkerInfoRetMsg{"", std::move(infos)});
  Json out = std::move(j["worker_infos"]);
  for (std::size_t i = 0; i < listing.size(); ++i) out[i]["key_count"] = listing[i].key_count;
  return out;
}

std::string_view reason_of(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 414:
      return "URI Too Long";
    case 500:
      return "Internal Server Error";
    default:
      return "Error";
  }
}

}  // namespace

struct HttpApi::Impl {
  Orchestrator& orch;
  const Guarded<Registry>& registry;
  Metrics& metrics;
  Uuid4Generator uuids;
  httpd::Server server;

  Impl(Orchestrator& o, const Guarded<Registry>& r, Metrics& m, httpd::Limits limits)
      : orch(o), registry(r), metrics(m), server("kvc/http", limits) {
    configure();
    routes();
  }

  std::string event_id(std::string_view prefix) { return std::string(prefix) + uuids.next(); }
  Reply call(const wire::Msg& msg) { return from_orch(orch.handle(msg)); }

  void configure() {
    httplib::Server& raw = server.raw();
    raw.set_logger([this](const httplib::Request&, const httplib::Response&) {
      metrics.http_requests.fetch_add(1, std::memory_order_relaxed);
    });
    // Runs for every status >= 400, ours included: fill in only bodies nobody wrote (no route,
    // payload too large, ...), so every error is {"detail": ...} as FastAPI answers.
    const std::size_t body_limit = server.limits().max_body_bytes;
    raw.set_error_handler(httplib::Server::HandlerWithResponse(
        [body_limit](const httplib::Request&, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          const std::string text =
              res.status == 413
                  ? "Request body too large (limit " + std::to_string(body_limit / kMiB) + " MiB)"
                  : std::string(reason_of(res.status));
          res.set_content(http::detail(text), "application/json");
          return httplib::Server::HandlerResponse::Handled;
        }));
    raw.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          res.status = 500;
          res.set_content(http::detail(what), "application/json");
        });
  }

  static void send(httplib::Response& res, const Reply& reply) {
    res.status = reply.status;
    res.set_content(reply.body, reply.content_type.c_str());
  }

  void post(const std::string& path, std::function<Reply(const http::Body&)> handler) {
    server.post(path, [handler](const httplib::Request& req, httplib::Response& res) {
      auto body = http::parse_object(req.body);
      send(res, body ? handler(*body) : invalid(body.error()));
    });
  }

  void get(const std::string& path, std::function<Reply(const httplib::Request&)> handler) {
    server.get(path, [handler](const httplib::Request& req, httplib::Response& res) {
      send(res, handler(req));
    });
  }

  void routes();
  Reply workers(const httplib::Request& req);
  Reply key_stats();
  Reply prometheus();
};

// Each handler reads its fields in LMCache's order; the first bad one is the 422's detail.
void HttpApi::Impl::routes() {
  post("/lookup", [this](const http::Body& b) {
    auto tokens = http::get_int_list(b, "tokens");
    if (!tokens) return invalid(tokens.error());
    return call(wire::LookupMsg{event_id("Lookup"), std::move(*tokens)});
  });
  post("/clear", [this](const http::Body& b) {
    auto instance = http::get_string(b, "instance_id");
    if (!instance) return invalid(instance.error());
    auto location = http::get_string(b, "location");
    if (!location) return invalid(location.error());
    return call(wire::ClearMsg{event_id("Clear"), std::move(*instance), std::move(*location)});
  });
  post("/pin", [this](const http::Body& b) {
    auto instance = http::get_string(b, "instance_id");
    if (!instance) return invalid(instance.error());
    auto location = http::get_string(b, "location");
    if (!location) return invalid(location.error());
    auto tokens = http::get_int_list(b, "tokens");
    if (!tokens) return invalid(tokens.error());
    return call(wire::PinMsg{event_id("Pin"), std::move(*instance), std::move(*location),
                             std::move(*tokens)});
  });
  const auto codec = [this]<class M>(std::string_view prefix, const http::Body& b) {
    auto instance = http::get_string(b, "instance_id");
    if (!instance) return invalid(instance.error());
    auto method = http::get_string(b, "method");
    if (!method) return invalid(method.error());
    auto location = http::get_string(b, "location");
    if (!location) return invalid(location.error());
    auto tokens = http::get_int_list(b, "tokens", std::vector<std::int64_t>{});
    if (!tokens) return invalid(tokens.error());
    return call(M{event_id(prefix), std::move(*instance), std::move(*method), std::move(*location),
                  std::move(*tokens)});
  };
  post("/compress", [codec](const http::Body& b) {
    return codec.template operator()<wire::CompressMsg>("Compress", b);
  });
  post("/decompress", [codec](const http::Body& b) {
    return codec.template operator()<wire::DecompressMsg>("Decompress", b);
  });
  post("/move", [this](const http::Body& b) {
    auto old_position = http::get_position(b, "old_position");
    if (!old_position) return invalid(old_position.error());
    auto new_position = http::get_position(b, "new_position");
    if (!new_position) return invalid(new_position.error());
    auto tokens = http::get_int_list(b, "tokens", std::vector<std::int64_t>{});
    if (!tokens) return invalid(tokens.error());
    auto copy = http::get_bool(b, "should_copy", false);
    if (!copy) return invalid(copy.error());
    return call(wire::MoveMsg{event_id("Move"), std::move(*old_position), std::move(*new_position),
                              std::move(*tokens), *copy});
  });
  post("/health", [this](const http::Body& b) {
    auto instance = http::get_string(b, "instance_id");
    if (!instance) return invalid(instance.error());
    return call(wire::HealthMsg{event_id("health"), std::move(*instance)});
  });
  post("/check_finish", [this](const http::Body& b) {
    auto id = http::get_string(b, "event_id");
    if (!id) return invalid(id.error());
    OrchReply r = orch.handle(wire::CheckFinishMsg{*id});
    if (!r.event) return from_orch(r);
    Json j = Json::object();
    j["event_id"] = *id;
    j["status"] = std::string(to_string(r.event->state));
    j["num_tokens"] = r.event->num_tokens;
    if (r.event->state == EventRecord::State::kFailed) j["detail"] = r.event->reason;
    return ok(j);
  });
  post("/query_instance", [this](const http::Body& b) {
    // The body's event_id is ignored, as upstream does; the reply carries a fresh one.
    auto ip = http::get_string(b, "ip");
    if (!ip) return invalid(ip.error());
    OrchReply r = orch.handle(wire::QueryInstMsg{event_id("QueryInst"), *ip});
    const auto* ret = std::get_if<wire::QueryInstRetMsg>(&r.reply);
    if (!ret) return from_orch(r);
    // Upstream fails validation here (500); an unknown ip is a 404 with a plain reason.
    if (!ret->instance_id) return fail(404, "no registered worker has ip '" + *ip + "'");
    Json j = Json::object();
    j["event_id"] = ret->event_id;
    j["res"] = *ret->instance_id;
    return ok(j);
  });
  post("/query_worker_info", [this](const http::Body& b) {
    auto instance = http::get_string(b, "instance_id");
    if (!instance) return invalid(instance.error());
    auto ids = http::get_nullable_int_list(b, "worker_ids");
    if (!ids) return invalid(ids.error());
    return call(wire::QueryWorkerInfoMsg{event_id("QueryWorkerInfo"), std::move(*instance), *ids});
  });
  get("/controller/workers", [this](const httplib::Request& req) { return workers(req); });
  get("/controller/key-stats", [this](const httplib::Request&) { return key_stats(); });
  get("/metrics", [this](const httplib::Request&) { return prometheus(); });
}

// Both parameters: one WorkerInfo; instance_id only: that instance's workers; neither: all.
Reply HttpApi::Impl::workers(const httplib::Request& req) {
  const std::string instance =
      req.has_param("instance_id") ? req.get_param_value("instance_id") : std::string();
  std::optional<std::int64_t> worker_id;
  if (req.has_param("worker_id")) {
    auto v = http::get_query_int("worker_id", req.get_param_value("worker_id"));
    if (!v) return invalid(v.error());
    worker_id = *v;
  }
  std::vector<std::int64_t> ids;
  if (worker_id) ids.push_back(*worker_id);
  auto infos = registry.read([&](const Registry& r) {
    return r.worker_listing(instance.empty() ? "all" : instance, ids);
  });
  if (!instance.empty() && worker_id) {
    if (infos.empty())
      return fail(404, "worker " + std::to_string(*worker_id) + " of instance '" + instance +
                           "' not found");
    return ok(worker_listing_json(std::move(infos))[0]);
  }
  if (!instance.empty() && infos.empty()) return fail(404, "unknown instance '" + instance + "'");
  Json j = Json::object();
  j["total_count"] = infos.size();
  j["workers"] = worker_listing_json(std::move(infos));
  // FastAPI keeps the handler's key order: workers first.
  Json ordered = Json::object();
  ordered["workers"] = std::move(j["workers"]);
  ordered["total_count"] = std::move(j["total_count"]);
  return ok(ordered);
}

Reply HttpApi::Impl::key_stats() {
  const RegistryStats stats = registry.read([](const Registry& r) { return r.stats(); });
  Json instances = Json::array();
  for (const auto& s : stats.per_instance) {
    Json i = Json::object();
    i["instance_id"] = s.instance_id;
    i["key_count"] = s.key_count;
    i["worker_count"] = s.worker_count;
    instances.push_back(std::move(i));
  }
  Json j = Json::object();
  j["total_key_count"] = stats.keys;
  j["total_instance_count"] = stats.instances;
  j["total_worker_count"] = stats.workers;
  j["instances"] = std::move(instances);
  return ok(j);
}

Reply HttpApi::Impl::prometheus() {
  const RegistryStats stats = registry.read([](const Registry& r) { return r.stats(); });
  return Reply{
      200,
      render_prometheus(metrics, stats) + httpd::prometheus_text(server.counters(), "kvcontroller"),
      "text/plain; version=0.0.4; charset=utf-8"};
}

HttpApi::HttpApi(Orchestrator& orchestrator, const Guarded<Registry>& registry, Metrics& metrics,
                 httpd::Limits limits)
    : impl_(std::make_unique<Impl>(orchestrator, registry, metrics, limits)) {}

HttpApi::~HttpApi() {
  stop();
}

Result<int> HttpApi::start(const std::string& host, int port) {
  return impl_->server.start(host, port);
}

// Handlers finish their current request (a fan-out waits at most its deadline) first.
void HttpApi::stop() {
  impl_->server.stop();
}

}  // namespace kvnode::controller
