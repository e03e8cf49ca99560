#include "ps/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace tessera::metrics {
namespace {

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "tessera metrics: %s\n", what.c_str());
  std::abort();
}

bool ValidName(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

const char* TypeName(Registry::Type t) {
  switch (t) {
    case Registry::Type::kCounter:
      return "counter";
    case Registry::Type::kGauge:
      return "gauge";
    case Registry::Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// A float as the text format writes it: integers without a fraction, +Inf/-Inf/NaN by name.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

// {a="x",b="y"} with `extra` (e.g. le) last; empty when there are no labels.
std::string LabelText(const Labels& labels, const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return "";
  std::string s = "{";
  bool first = true;
  auto put = [&](const std::string& k, const std::string& v) {
    if (!first) s += ',';
    first = false;
    s += k + "=\"" + EscapeLabelValue(v) + "\"";
  };
  for (const auto& [k, v] : labels) put(k, v);
  if (extra != nullptr) put(extra->first, extra->second);
  return s + "}";
}

}  // namespace

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end())) Misuse("histogram bounds not ascending");
}

void Histogram::Observe(double v) {
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

struct Registry::Family {
  std::string name, help;
  Type type;
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::vector<Series> series;
  std::vector<std::pair<const void*, Collector>> collectors;

  Series* Find(const Labels& labels) {
    for (auto& s : series) {
      if (s.labels == labels) return &s;
    }
    return nullptr;
  }
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::FamilyFor(const std::string& name, const std::string& help,
                                      Type type) {
  if (!ValidName(name)) Misuse("invalid metric name '" + name + "'");
  for (auto& f : families_) {
    if (f->name != name) continue;
    if (f->type != type) Misuse("metric '" + name + "' registered with two types");
    return *f;
  }
  families_.push_back(std::make_unique<Family>(Family{name, help, type, {}, {}}));
  return *families_.back();
}

Counter& Registry::AddCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  MutexLock l(mu_);
  Family& f = FamilyFor(name, help, Type::kCounter);
  if (auto* s = f.Find(labels)) return *s->counter;
  f.series.push_back({labels, std::make_unique<Counter>(), nullptr, nullptr});
  return *f.series.back().counter;
}

Gauge& Registry::AddGauge(const std::string& name, const std::string& help,
                          const Labels& labels) {
  MutexLock l(mu_);
  Family& f = FamilyFor(name, help, Type::kGauge);
  if (auto* s = f.Find(labels)) return *s->gauge;
  f.series.push_back({labels, nullptr, std::make_unique<Gauge>(), nullptr});
  return *f.series.back().gauge;
}

Histogram& Registry::AddHistogram(const std::string& name, const std::string& help,
                                  const Labels& labels, const std::vector<double>& upper_bounds) {
  MutexLock l(mu_);
  Family& f = FamilyFor(name, help, Type::kHistogram);
  if (auto* s = f.Find(labels)) return *s->histogram;
  f.series.push_back({labels, nullptr, nullptr, std::make_unique<Histogram>(upper_bounds)});
  return *f.series.back().histogram;
}

void Registry::AddCollector(const void* owner, const std::string& name, const std::string& help,
                            Type type, Collector fn) {
  if (type == Type::kHistogram) Misuse("a collector gives counters or gauges");
  MutexLock l(mu_);
  FamilyFor(name, help, type).collectors.emplace_back(owner, std::move(fn));
}

void Registry::RemoveCollectors(const void* owner) {
  MutexLock l(mu_);
  for (auto& f : families_) {
    std::erase_if(f->collectors, [owner](const auto& c) { return c.first == owner; });
  }
}

std::string Registry::Text() const {
  MutexLock l(mu_);
  std::ostringstream o;
  for (const auto& f : families_) {
    std::vector<Sample> computed;
    for (const auto& [owner, fn] : f->collectors) {
      for (auto& s : fn()) computed.push_back(std::move(s));
    }
    if (f->series.empty() && computed.empty()) continue;
    o << "# HELP " << f->name << ' ' << f->help << "\n# TYPE " << f->name << ' '
      << TypeName(f->type) << '\n';
    for (const auto& s : f->series) {
      if (s.counter) {
        o << f->name << LabelText(s.labels, nullptr) << ' ' << s.counter->value() << '\n';
      } else if (s.gauge) {
        o << f->name << LabelText(s.labels, nullptr) << ' ' << FormatValue(s.gauge->value())
          << '\n';
      } else {
        const std::vector<uint64_t> counts = s.histogram->bucket_counts();
        const auto& bounds = s.histogram->upper_bounds();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::pair<std::string, std::string> le{
              "le", i < bounds.size() ? FormatValue(bounds[i]) : "+Inf"};
          o << f->name << "_bucket" << LabelText(s.labels, &le) << ' ' << cumulative << '\n';
        }
        o << f->name << "_sum" << LabelText(s.labels, nullptr) << ' '
          << FormatValue(s.histogram->sum()) << '\n'
          << f->name << "_count" << LabelText(s.labels, nullptr) << ' ' << cumulative << '\n';
      }
    }
    for (const auto& s : computed) {
      o << f->name << LabelText(s.labels, nullptr) << ' ' << FormatValue(s.value) << '\n';
    }
  }
  return o.str();
}

}  // namespace tessera::metrics
