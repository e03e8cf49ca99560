#include "ps/cli.h"

#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#ifndef TESSERA_VERSION
#error "TESSERA_VERSION must be defined (CMake's PROJECT_VERSION, see ps/CMakeLists.txt)"
#endif

namespace tessera::cli {
namespace {

constexpr size_t kWidth = 100;  // columns of wrapped descriptions

// A default as a user would type it: doubles in their shortest round-trip form (gflags prints
// 0.003 as 0.0030000000000000001), strings quoted.
std::string ShowDefault(const gflags::CommandLineFlagInfo& f) {
  if (f.type == "string") return "\"" + f.default_value + "\"";
  if (f.type == "double") {
    char* end = nullptr;
    const double v = std::strtod(f.default_value.c_str(), &end);
    char buf[64];
    // A default written as a float (0.01f) reads as one, not as 0.009999999776482582.
    const float as_float = static_cast<float>(v);
    auto [p, ec] = static_cast<double>(as_float) == v
                       ? std::to_chars(buf, buf + sizeof(buf), as_float)
                       : std::to_chars(buf, buf + sizeof(buf), v);
    if (end != f.default_value.c_str() && ec == std::errc()) return std::string(buf, p);
  }
  return f.default_value;
}

// "--name=TYPE" or "--[no]name" for booleans.
std::string Synopsis(const gflags::CommandLineFlagInfo& f) {
  if (f.type == "bool") return "--[no]" + f.name;
  std::string type = f.type;
  for (char& c : type) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return "--" + f.name + "=" + type;
}

// Appends `text` word-wrapped to kWidth columns, each line indented by `indent` spaces.
void AppendWrapped(std::string* out, std::string_view text, size_t indent) {
  size_t col = 0;
  size_t i = 0;
  while (i < text.size()) {
    const size_t j = text.find(' ', i);
    const std::string_view word = text.substr(i, j == std::string_view::npos ? j : j - i);
    if (col > 0 && col + 1 + word.size() > kWidth) {
      *out += '\n';
      col = 0;
    }
    if (col == 0) {
      out->append(indent, ' ');
      col = indent;
    } else {
      *out += ' ';
      ++col;
    }
    *out += word;
    col += word.size();
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  *out += '\n';
}

bool BoolFlag(const char* name) {
  std::string v;
  return gflags::GetCommandLineOption(name, &v) && v == "true";
}

}  // namespace

std::string_view Version() { return TESSERA_VERSION; }

std::string HelpText(const ToolInfo& tool) {
  std::string out(tool.usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += "\nFlags:\n";
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);  // sorted by file, then name
  for (const auto& f : flags) {
    if (f.filename != tool.flags_file) continue;
    out += "  " + Synopsis(f) + "  (default: " + ShowDefault(f) + ")\n";
    AppendWrapped(&out, f.description, 6);
  }
  out +=
      "\nCommon flags:\n"
      "  --help, -h       this text\n"
      "  --helpfull       every flag, also those of glog (logging) and gflags\n"
      "  --version        print the version\n"
      "  --flagfile=FILE  read flags from FILE, one --flag=value a line\n";
  if (!tool.epilog.empty()) {
    out += '\n';
    out += tool.epilog;
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

namespace {

// The most bytes a --flagfile may hold (gflags reads each whole into memory), and how deep
// flag files may name others.
constexpr size_t kMaxFlagfileBytes = size_t{1} << 20;
constexpr int kMaxFlagfileDepth = 8;

// Why the flag file `path` (and those it names in turn) may not be read by gflags: not a
// regular file (/dev/urandom, a FIFO: opened without blocking), over kMaxFlagfileBytes, or
// nested too deep; nullopt when it may.
std::optional<std::string> CheckFlagfile(const std::string& path, int depth) {
  if (depth > kMaxFlagfileDepth) {
    return "--flagfile=" + path + ": flag files nest more than " +
           std::to_string(kMaxFlagfileDepth) + " deep";
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // gflags says that it cannot open it
  struct stat st {};
  std::string text;
  std::optional<std::string> why;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "--flagfile=" + path + " is not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > kMaxFlagfileBytes) {
    why = "--flagfile=" + path + " holds " + std::to_string(st.st_size) + " bytes, more than " +
          std::to_string(kMaxFlagfileBytes);
  } else {
    text.resize(kMaxFlagfileBytes);
    const ssize_t n = ::read(fd, text.data(), text.size());
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  if (why) return why;
  // Flag files named inside: "--flagfile=F" (or "-flagfile=F") lines.
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) {
      line.remove_prefix(1);
    }
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
      line.remove_suffix(1);
    }
    for (std::string_view prefix : {"--flagfile=", "-flagfile="}) {
      if (!line.starts_with(prefix)) continue;
      if (auto nested = CheckFlagfile(std::string(line.substr(prefix.size())), depth + 1)) {
        return nested;
      }
    }
  }
  return std::nullopt;
}

// CheckFlagfile for each --flagfile of the command line (--flagfile=F, --flagfile F).
std::optional<std::string> CheckFlagfiles(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a.starts_with("--")) a.remove_prefix(1);
    std::string path;
    if (a.starts_with("-flagfile=")) {
      path = std::string(a.substr(std::strlen("-flagfile=")));
    } else if (a == "-flagfile" && i + 1 < argc) {
      path = argv[++i];
    } else {
      continue;
    }
    if (auto why = CheckFlagfile(path, 1)) return why;
  }
  return std::nullopt;
}

}  // namespace

void ParseCommandLine(const ToolInfo& tool, int* argc, char*** argv) {
  gflags::SetUsageMessage(std::string(tool.usage));
  gflags::SetVersionString(std::string(Version()));
  // gflags knows no -h; it is the usual short form of --help.
  static char kHelp[] = "--help";
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--") == 0) break;
    if (std::strcmp((*argv)[i], "-h") == 0) (*argv)[i] = kHelp;
  }
  // gflags reads a flag file whole, without a bound: /dev/urandom would grow memory forever.
  if (auto why = CheckFlagfiles(*argc, *argv)) std::exit(UsageError(tool, *why));
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
  if (BoolFlag("help")) {
    std::fputs(HelpText(tool).c_str(), stdout);
    std::exit(0);
  }
  if (BoolFlag("helpfull")) {
    gflags::ShowUsageWithFlags((*argv)[0]);
    std::exit(0);
  }
  if (BoolFlag("version")) {
    std::printf("%.*s %.*s\n", static_cast<int>(tool.name.size()), tool.name.data(),
                static_cast<int>(Version().size()), Version().data());
    std::exit(0);
  }
  gflags::HandleCommandLineHelpFlags();  // --helpon, --helpmatch, --helpxml, ...
  if (!tool.positional_args && *argc > 1) {
    std::exit(UsageError(tool, std::string("unexpected argument '") + (*argv)[1] + "'"));
  }
}

bool CheckOneOf(const ToolInfo& tool, std::string_view flag, std::string_view value,
                std::initializer_list<std::string_view> allowed) {
  std::string list;
  for (std::string_view a : allowed) {
    if (a == value) return true;
    if (!list.empty()) list += ", ";
    list += a;
  }
  UsageError(tool, "--" + std::string(flag) + " must be one of " + list + " (got '" +
                       std::string(value) + "')");
  return false;
}

int UsageError(const ToolInfo& tool, std::string_view message) {
  std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(tool.name.size()), tool.name.data(),
               static_cast<int>(message.size()), message.data());
  return 2;
}

}  // namespace tessera::cli
