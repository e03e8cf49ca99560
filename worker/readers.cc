#include "worker/readers.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ps/feature_keys.h"
#include "worker/line_reader_internal.h"

namespace tessera::worker {
namespace {

using internal::LineParser;
using internal::LineReader;
using internal::ParseError;
using internal::ParseNumber;
using internal::Split;

class CriteoParser final : public LineParser {
 public:
  explicit CriteoParser(const std::string& path) : path_(path) {}

  Result<bool> Parse(std::string_view line, uint64_t line_no, Batch* batch) override {
    Split(line, '\t', &cols_);
    if (cols_.size() != 1 + kCriteoDense + kCriteoFields) {
      return ParseError(path_, line_no,
                        "expected 40 tab-separated columns, got " + std::to_string(cols_.size()));
    }
    int label = 0;
    if (!ParseNumber(cols_[0], &label) || (label != 0 && label != 1)) {
      return ParseError(path_, line_no, "label must be 0 or 1");
    }
    for (uint32_t j = 0; j < kCriteoDense; ++j) {
      std::string_view c = cols_[1 + j];
      double x = 0;
      if (!c.empty() && !ParseNumber(c, &x)) {
        return ParseError(path_, line_no,
                          "integer feature " + std::to_string(j) + " is not a number");
      }
      batch->dense.push_back(static_cast<float>(std::log1p(std::max(x, 0.0))));
    }
    for (uint32_t f = 0; f < kCriteoFields; ++f) {
      std::string_view c = cols_[1 + kCriteoDense + f];
      if (!c.empty()) {
        uint64_t v = 0;
        const uint64_t key =
            (c.size() <= 16 && ParseNumber(c, &v, 16)) ? MakeKey(f, v) : MakeStringKey(f, c);
        batch->keys.push_back(key);
        if (!batch->weights.empty()) batch->weights.push_back(1.0f);
      }
      batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    }
    batch->labels.push_back(static_cast<float>(label));
    return true;
  }

 private:
  const std::string path_;
  std::vector<std::string_view> cols_;
};

class CriteoReader final : public LineReader {
 public:
  explicit CriteoReader(std::unique_ptr<ShardedLineReader> lines)
      : LineReader(std::move(lines),
                   Schema{.num_dense = kCriteoDense, .num_fields = kCriteoFields}) {}

 private:
  std::unique_ptr<LineParser> NewParser() const override {
    return std::make_unique<CriteoParser>(path());
  }
  bool EveryLineIsASample() const override { return true; }
};

struct LibsvmFeature {
  uint32_t field;
  uint64_t key;
  float weight;
};

// Parses one line into features sorted by field (stable) and a label; errors name `path` and
// `line_no`.
Status ParseLibsvmFeatures(std::string_view line, uint32_t nf, bool by_position,
                           const std::string& path, uint64_t line_no,
                           std::vector<LibsvmFeature>* out, float* label) {
  std::vector<std::string_view> toks;
  std::vector<std::string_view> parts;
  Split(line, ' ', &toks);
  toks.erase(std::remove(toks.begin(), toks.end(), std::string_view()), toks.end());
  if (toks.empty()) return ParseError(path, line_no, "empty line");
  double y = 0;
  if (!ParseNumber(toks[0], &y)) return ParseError(path, line_no, "label is not a number");
  *label = y > 0 ? 1.0f : 0.0f;
  out->clear();
  for (size_t i = 1; i < toks.size(); ++i) {
    Split(toks[i], ':', &parts);
    uint32_t field = 0;
    uint64_t idx = 0;
    float val = 1.0f;
    if (parts.size() == 3) {
      if (!ParseNumber(parts[0], &field) || !ParseNumber(parts[1], &idx) ||
          !ParseNumber(parts[2], &val)) {
        return ParseError(path, line_no, "bad field:index:value '" + std::string(toks[i]) + "'");
      }
      if (nf != 0 && field >= nf) {
        return ParseError(
            path, line_no,
            "field " + std::to_string(field) + " >= num_fields " + std::to_string(nf));
      }
    } else if (parts.size() == 2) {
      if (!ParseNumber(parts[0], &idx) || !ParseNumber(parts[1], &val)) {
        return ParseError(path, line_no, "bad index:value '" + std::string(toks[i]) + "'");
      }
      const uint32_t pos = static_cast<uint32_t>(i - 1);
      field = by_position ? std::min(pos, nf == 0 ? pos : nf - 1) : 0;
    } else {
      return ParseError(path, line_no, "bad feature '" + std::string(toks[i]) + "'");
    }
    if (field >= kMaxFields) return ParseError(path, line_no, "field id too large");
    if (!std::isfinite(val)) return ParseError(path, line_no, "feature value not finite");
    out->push_back({field, MakeKey(field, idx), val});
  }
  std::stable_sort(out->begin(), out->end(), [](const LibsvmFeature& a, const LibsvmFeature& b) {
    return a.field < b.field;
  });
  return Status::OK();
}

class LibsvmParser final : public LineParser {
 public:
  LibsvmParser(const std::string& path, uint32_t num_fields, bool by_position)
      : path_(path), nf_(num_fields), by_position_(by_position) {}

  Result<bool> Parse(std::string_view line, uint64_t line_no, Batch* batch) override {
    TESSERA_RETURN_IF_ERROR(
        ParseLibsvmFeatures(line, nf_, by_position_, path_, line_no, &bags_, &label_));
    // Sample-major keys: bags_ holds (field, key, weight) in field order after the sort.
    if (batch->weights.size() != batch->keys.size()) batch->weights.resize(batch->keys.size(), 1);
    size_t i = 0;
    for (uint32_t f = 0; f < nf_; ++f) {
      while (i < bags_.size() && bags_[i].field == f) {
        batch->keys.push_back(bags_[i].key);
        batch->weights.push_back(bags_[i].weight);
        ++i;
      }
      batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    }
    batch->labels.push_back(label_);
    return true;
  }

 private:
  const std::string path_;
  const uint32_t nf_;
  const bool by_position_;
  std::vector<LibsvmFeature> bags_;
  float label_ = 0;
};

class LibsvmReader final : public LineReader {
 public:
  LibsvmReader(std::unique_ptr<ShardedLineReader> lines, uint32_t num_fields, bool by_position)
      : LineReader(std::move(lines), Schema{.num_fields = num_fields}), by_position_(by_position) {}

 private:
  std::unique_ptr<LineParser> NewParser() const override {
    return std::make_unique<LibsvmParser>(path(), schema().num_fields, by_position_);
  }
  bool EveryLineIsASample() const override { return true; }

  const bool by_position_;
};

// ------------------------------------------------------------------ MovieLens

struct MovieInfo {
  std::vector<uint64_t> genres;
  uint64_t year_key = 0;
  bool has_year = false;
  std::vector<uint64_t> tags;
};

enum MovieLensField : uint32_t { kUser = 0, kMovie = 1, kGenres = 2, kYear = 3, kTags = 4 };

class MovieLensParser final : public LineParser {
 public:
  MovieLensParser(const std::string& path,
                  std::shared_ptr<const std::unordered_map<uint64_t, MovieInfo>> movies,
                  int64_t from, int64_t to, double threshold)
      : path_(path), movies_(std::move(movies)), from_(from), to_(to), threshold_(threshold) {}

  Result<bool> Parse(std::string_view line, uint64_t line_no, Batch* batch) override {
    static const MovieInfo kNone;
    Split(line, ',', &cols_);
    uint64_t user = 0, movie = 0;
    double rating = 0;
    int64_t ts = 0;
    if (cols_.size() != 4 || !ParseNumber(cols_[0], &user) || !ParseNumber(cols_[1], &movie) ||
        !ParseNumber(cols_[2], &rating) || !ParseNumber(cols_[3], &ts)) {
      return ParseError(path_, line_no, "expected userId,movieId,rating,timestamp");
    }
    if (ts < from_ || ts >= to_) return false;  // another part of the time split
    auto it = movies_->find(movie);
    const MovieInfo& info = it == movies_->end() ? kNone : it->second;
    if (!batch->weights.empty()) batch->weights.resize(batch->keys.size(), 1.0f);
    auto add = [&](uint64_t key) { batch->keys.push_back(key); };
    add(MakeKey(kUser, user));
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    add(MakeKey(kMovie, movie));
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    for (uint64_t k : info.genres) add(k);
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    if (info.has_year) add(info.year_key);
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    for (uint64_t k : info.tags) add(k);
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    if (!batch->weights.empty()) batch->weights.resize(batch->keys.size(), 1.0f);
    batch->labels.push_back(rating >= threshold_ ? 1.0f : 0.0f);
    return true;
  }

 private:
  const std::string path_;
  std::shared_ptr<const std::unordered_map<uint64_t, MovieInfo>> movies_;
  const int64_t from_, to_;  // the part's timestamps: [from_, to_)
  const double threshold_;
  std::vector<std::string_view> cols_;
};

// Lines of other parts of the time split are skipped, so a chunk's sample count is only known
// once parsed: ReadChunk is the default (parsed on the reading thread).
class MovieLensReader final : public LineReader {
 public:
  MovieLensReader(std::unique_ptr<ShardedLineReader> lines,
                  std::shared_ptr<const std::unordered_map<uint64_t, MovieInfo>> movies,
                  int64_t from, int64_t to, double threshold)
      : LineReader(std::move(lines), Schema{.num_fields = kMovieLensFields}),
        movies_(std::move(movies)),
        from_(from),
        to_(to),
        threshold_(threshold) {}

 private:
  std::unique_ptr<LineParser> NewParser() const override {
    return std::make_unique<MovieLensParser>(path(), movies_, from_, to_, threshold_);
  }
  bool EveryLineIsASample() const override { return false; }

  std::shared_ptr<const std::unordered_map<uint64_t, MovieInfo>> movies_;
  const int64_t from_, to_;
  const double threshold_;
};

Status LoadMovies(const std::string& dir, bool use_tags,
                  std::unordered_map<uint64_t, MovieInfo>* movies) {
  const std::string path = dir + "/movies.csv";
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open " + path);
  std::string line;
  std::vector<std::string> cols;
  std::vector<std::string_view> genres;
  uint64_t line_no = 0;
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(const bool more, internal::NextLineOf(in, path, line_no + 1, &line));
    if (!more) break;
    if (++line_no == 1) continue;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    internal::SplitQuoted(line, ',', &cols);
    uint64_t id = 0;
    if (cols.size() != 3 || !ParseNumber(std::string_view(cols[0]), &id)) {
      return Status::Corruption(path + ":" + std::to_string(line_no) +
                                ": expected movieId,title,genres");
    }
    MovieInfo& info = (*movies)[id];
    Split(cols[2], '|', &genres);
    for (std::string_view g : genres) {
      if (!g.empty() && g != "(no genres listed)") info.genres.push_back(MakeStringKey(kGenres, g));
    }
    // The release year is the last "(YYYY)" of the title.
    std::string_view title = cols[1];
    while (!title.empty() && title.back() == ' ') title.remove_suffix(1);
    int year = 0;
    if (title.size() >= 6 && title.back() == ')' && title[title.size() - 6] == '(' &&
        ParseNumber(title.substr(title.size() - 5, 4), &year)) {
      info.has_year = true;
      info.year_key = MakeKey(kYear, static_cast<uint64_t>(year));
    }
  }
  if (!use_tags) return Status::OK();
  const std::string tags_path = dir + "/tags.csv";
  std::ifstream tin(tags_path);
  if (!tin) return Status::OK();  // tags.csv is optional
  line_no = 0;
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(const bool more,
                             internal::NextLineOf(tin, tags_path, line_no + 1, &line));
    if (!more) break;
    if (++line_no == 1) continue;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    internal::SplitQuoted(line, ',', &cols);
    uint64_t movie = 0;
    if (cols.size() != 4 || !ParseNumber(std::string_view(cols[1]), &movie)) {
      return Status::Corruption(tags_path + ":" + std::to_string(line_no) +
                                ": expected userId,movieId,tag,timestamp");
    }
    std::string tag = cols[2];
    std::transform(tag.begin(), tag.end(), tag.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const uint64_t key = MakeStringKey(kTags, tag);
    auto& tags = (*movies)[movie].tags;
    if (std::find(tags.begin(), tags.end(), key) == tags.end()) tags.push_back(key);
  }
  return Status::OK();
}

// The timestamp below which `fraction` of ratings lie, from an hourly histogram (one streaming
// pass over ratings.csv; memory grows with the time span, not the number of ratings).
Result<int64_t> TimeCutoff(const std::string& path, double fraction) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open " + path);
  std::map<int64_t, uint64_t> hours;
  std::string line;
  uint64_t total = 0, line_no = 0;
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(const bool more, internal::NextLineOf(in, path, line_no + 1, &line));
    if (!more) break;
    if (++line_no == 1) continue;
    size_t comma = line.rfind(',');
    if (comma == std::string::npos) continue;
    int64_t ts = 0;
    std::string_view t(line);
    t = t.substr(comma + 1);
    while (!t.empty() && (t.back() == '\r' || t.back() == ' ')) t.remove_suffix(1);
    if (!ParseNumber(t, &ts)) {
      return Status::Corruption(path + ":" + std::to_string(line_no) + ": bad timestamp");
    }
    ++hours[ts / 3600];
    ++total;
  }
  if (total == 0) return Status::InvalidArgument(path + " has no ratings");
  const uint64_t want = static_cast<uint64_t>(fraction * static_cast<double>(total));
  uint64_t seen = 0;
  for (const auto& [hour, count] : hours) {
    seen += count;
    if (seen >= want) return (hour + 1) * 3600;
  }
  return (hours.rbegin()->first + 1) * 3600;
}

}  // namespace

Result<std::unique_ptr<DataReader>> OpenCriteo(const std::string& path, const ShardOptions& shard) {
  TESSERA_ASSIGN_OR_RETURN(auto lines, ShardedLineReader::Open(path, shard, false));
  return std::unique_ptr<DataReader>(new CriteoReader(std::move(lines)));
}

Result<std::unique_ptr<DataReader>> OpenLibsvm(const std::string& path, const ShardOptions& shard,
                                               const LibsvmOptions& options) {
  uint32_t nf = options.num_fields;
  if (nf == 0) {
    // Detect from the first data line of the file.
    TESSERA_ASSIGN_OR_RETURN(auto probe, ShardedLineReader::Open(path, ShardOptions{}, false));
    std::string line;
    TESSERA_ASSIGN_OR_RETURN(const bool any, probe->Next(&line));
    if (!any) return Status::InvalidArgument(path + " has no data lines");
    std::vector<LibsvmFeature> feats;
    float label = 0;
    TESSERA_RETURN_IF_ERROR(ParseLibsvmFeatures(line, 0, options.field_by_position, path,
                                                probe->line_number(), &feats, &label));
    uint32_t max_field = 0;
    for (const auto& f : feats) max_field = std::max(max_field, f.field);
    nf = std::max<uint32_t>(1, max_field + 1);
  }
  if (nf > kMaxFields) return Status::InvalidArgument("too many fields");
  TESSERA_ASSIGN_OR_RETURN(auto lines, ShardedLineReader::Open(path, shard, false));
  return std::unique_ptr<DataReader>(
      new LibsvmReader(std::move(lines), nf, options.field_by_position));
}

Result<std::unique_ptr<DataReader>> OpenMovieLens(const std::string& dir, const ShardOptions& shard,
                                                  const MovieLensOptions& options) {
  if (!(options.train_fraction > 0 && options.train_fraction < 1)) {
    return Status::InvalidArgument("train_fraction must be in (0, 1)");
  }
  auto movies = std::make_shared<std::unordered_map<uint64_t, MovieInfo>>();
  TESSERA_RETURN_IF_ERROR(LoadMovies(dir, options.use_tags, movies.get()));
  const std::string ratings = dir + "/ratings.csv";
  TESSERA_ASSIGN_OR_RETURN(int64_t cutoff, TimeCutoff(ratings, options.train_fraction));
  // The split is by time, so holdout_mod does not apply; rank/world deal the part's lines.
  ShardOptions lines_opt = shard;
  lines_opt.holdout_mod = 0;
  lines_opt.part = ShardOptions::Part::kAll;
  // Round-robin over all lines would give a rank a varying share of the part; deal per part
  // instead by filtering inside the reader: open with world 1 and shard below.
  lines_opt.rank = 0;
  lines_opt.world = 1;
  TESSERA_ASSIGN_OR_RETURN(auto lines, ShardedLineReader::Open(ratings, lines_opt, true));
  // Parts by time: [min, validation cut) train, [validation cut, cut) validation, [cut, max) test.
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t from = kMin, to = cutoff;
  if (shard.part == ShardOptions::Part::kTest) {
    from = cutoff;
    to = kMax;
  } else if (options.validation_fraction > 0) {
    if (!(options.validation_fraction < 1)) {
      return Status::InvalidArgument("validation_fraction must be in [0, 1)");
    }
    TESSERA_ASSIGN_OR_RETURN(
        int64_t vcut,
        TimeCutoff(ratings, options.train_fraction * (1 - options.validation_fraction)));
    if (options.validation) {
      from = vcut;
    } else {
      to = vcut;
    }
  }
  std::unique_ptr<DataReader> reader(
      new MovieLensReader(std::move(lines), movies, from, to, options.click_threshold));
  if (shard.world <= 1) return reader;
  return ShardReader(std::move(reader), shard.rank, shard.world);
}

}  // namespace tessera::worker
