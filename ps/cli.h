// The command-line conventions every Tessera program shares: --help lists the program's own
// flags (not glog's) and exits 0, --version prints "NAME VERSION", and enum flags are checked
// with one message. For main() only: it reads and exits the process; no library calls it.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace tessera::cli {

/// What a program says about itself.
struct ToolInfo {
  /// The program's name, e.g. "tessera-worker": the prefix of its messages and of --version.
  std::string_view name;
  /// Usage: a synopsis line and what the program does, printed first by --help.
  std::string_view usage;
  /// The file that defines the program's flags: pass `__FILE__` from its main file. --help
  /// lists the flags defined there.
  std::string_view flags_file;
  /// Printed after the flags by --help (e.g. tessera-ctl's commands). Default: nothing.
  std::string_view epilog = {};
  /// Whether the program takes positional arguments (tessera-ctl's COMMAND). When false, one
  /// left after the flags is refused: "NAME: unexpected argument 'X'", exit 2. Default: false.
  bool positional_args = false;
};

/// The build's version (CMake's PROJECT_VERSION), e.g. "0.1.0".
std::string_view Version();

/// The text of --help: `usage`, the flags defined in `flags_file` with their defaults, the
/// common flags (--help, --helpfull, --version, --flagfile) and `epilog`.
std::string HelpText(const ToolInfo& tool);

/// Parses the command line with gflags and removes the flags from argv (argv[0] and the
/// positional arguments stay). --help or -h prints HelpText to stdout and exits 0; --helpfull
/// prints every flag, glog's too, and exits 0; --version prints "NAME VERSION" and exits 0. The
/// other help flags of gflags (--helpon=FILE, --helpmatch=S, ...) act as gflags documents. A flag
/// gflags cannot parse (unknown, or a value of the wrong type) exits 1 with its message; a
/// positional argument that the tool does not take (ToolInfo::positional_args) exits 2, and so
/// does a --flagfile (or one it names) that is not a regular file or holds more than 1 MiB.
void ParseCommandLine(const ToolInfo& tool, int* argc, char*** argv);

/// Whether `value`, the value of --`flag`, is one of `allowed`; if not, prints
/// "NAME: --FLAG must be one of A, B (got 'VALUE')" to stderr. Callers exit 2 on false.
bool CheckOneOf(const ToolInfo& tool, std::string_view flag, std::string_view value,
                std::initializer_list<std::string_view> allowed);

/// Prints "NAME: MESSAGE" to stderr and returns 2, the exit status of a bad command line.
int UsageError(const ToolInfo& tool, std::string_view message);

}  // namespace tessera::cli
