#!/usr/bin/env bash
# Self-test of rules 5 and 6 of scripts/check_layout.sh (file size, function length): writes
# small C++ files into a temporary folder, runs `check_layout.sh --files` on each and checks that
# it flags exactly the ones it must. Usage: bash scripts/check_layout_test.sh
set -uo pipefail
guard="$(cd "$(dirname "$0")" && pwd)/check_layout.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0

body() {  # body N INDENT: N statement lines at INDENT
  local i
  for ((i = 1; i <= $1; ++i)); do echo "$2x += $i;"; done
}

# expect NAME VERDICT [LINE LENGTH]: the guard on $dir/NAME must report "ok", a function of
# LENGTH lines starting at LINE ("function"), a file over 700 lines ("size"), or a lost brace
# ("lost").
expect() {
  local name=$1 verdict=$2 out rc want
  out=$(bash "$guard" --files "$dir/$name" 2>&1)
  rc=$?
  case $verdict in
    ok) [[ $rc == 0 && $out == "layout: all rules hold" ]] ;;
    function)
      want="layout: $dir/$name:$3: function of $4 lines (at most 80 without a reason): "
      [[ $rc == 1 && $(grep -c . <<<"$out") == 1 && $out == "$want"* ]] ;;
    size) [[ $rc == 1 && $out == "layout: $dir/$name has $3 lines (at most 700)" ]] ;;
    lost) [[ $rc == 1 && $out == *"$dir/$name:$3: "*"the guard lost a brace"* ]] ;;
  esac || {
    echo "FAIL: $name: expected $verdict ${*:3}, got (exit $rc):"
    sed 's/^/  /' <<<"$out"
    failed=1
  }
}

# A 90-line function (signature, 88 body lines, closing brace) whose signature spans 3 lines.
{
  echo '#include <string>'
  echo ''
  echo 'int LongSignature(const std::string& first_argument_with_a_long_name,'
  echo '                  const std::string& second_argument_with_a_long_name,'
  echo '                  int third) {'
  echo '  int x = 0;'
  body 84 '  '
  echo '  return x;'
  echo '}'
} >"$dir/multiline_signature.cc"
expect multiline_signature.cc function 3 90

# main whose body is one 88-line lambda it calls.
{
  echo 'int main(int argc, char** argv) {'
  echo '  auto run = [&](int x) {'
  body 84 '    '
  echo '    return x;'
  echo '  };  // run'
  echo '  return run(argc);'
  echo '}  // main'
} >"$dir/main_lambda.cc"
expect main_lambda.cc function 1 90

# A top-level 90-line lambda, and one inside a class.
{
  echo 'namespace {'
  echo ''
  echo 'auto run = [](int x) {'
  body 87 '  '
  echo '  return x;'
  echo '};'
  echo ''
  echo '}  // namespace'
} >"$dir/top_level_lambda.cc"
expect top_level_lambda.cc function 3 90
{
  echo 'struct Runner {'
  echo '  static constexpr auto kRun = [] {'
  echo '    int x = 0;'
  body 86 '    '
  echo '    return x;'
  echo '  };'
  echo '};'
} >"$dir/member_lambda.h"
expect member_lambda.h function 2 90

# A 90-line member function defined in a class in a header, with a comment after its brace.
{
  echo '#pragma once'
  echo 'namespace tessera {'
  echo 'template <typename T>'
  echo 'class Holder {'
  echo ' public:'
  echo '  T Get(T x) const {'
  body 88 '    '
  echo '  }  // Get'
  echo '};'
  echo '}  // namespace tessera'
} >"$dir/member.h"
expect member.h function 6 90

# A 90-line function with its reason in the comment above (4 lines up): allowed.
{
  echo '// Decodes every field in turn.'
  echo '// long function: one switch over the field kinds reads best in one piece'
  echo '// (a third line of comment)'
  echo ''
  echo 'int WithReason(int x) {'
  body 88 '  '
  echo '}'
} >"$dir/with_reason.cc"
expect with_reason.cc ok
# ... but not when the reason is 7 lines up.
{
  echo '// long function: too far above'
  for i in 1 2 3 4 5 6; do echo "// line $i"; done
  echo 'int ReasonTooFar(int x) {'
  body 88 '  '
  echo '}'
} >"$dir/reason_too_far.cc"
expect reason_too_far.cc function 8 90

# An 80-line function (the most allowed), a template one with its braces and strings inside the
# body, a 200-line table (an initializer, not a function), a raw string with braces at column 0
# and a namespace: nothing to report.
{
  echo 'namespace a {'
  echo 'template <typename T, typename = std::enable_if_t<(sizeof(T) > 1)>>'
  echo 'T Eighty(T x) {'
  echo '  if (x > 0) {'
  body 72 '    '
  echo '  }'
  echo '  const char* s = "}";  // }'
  echo "  x += 1'000 + '}';  /* } */"
  echo '  return x;'
  echo '}'
  echo 'const int kTable[] = {'
  body 200 '    1, // '
  echo '};'
  echo 'const char* kJson = R"({'
  echo '"a": 1'
  echo '})";'
  echo 'extern "C" {'
  echo 'int Short() { return 1; }'
  echo '}'
  echo '}  // namespace a'
} >"$dir/eighty.cc"
expect eighty.cc ok
# One more line makes 81.
sed '5i\    x += 0;' "$dir/eighty.cc" >"$dir/eighty_one.cc"
expect eighty_one.cc function 2 81

# A function whose body has a raw string with a closing brace at column 0: it goes on past it.
{
  echo 'int RawString() {'
  echo '  const char* json = R"x({'
  echo '}'
  echo ')x";'
  body 85 '  '
  echo '  return 0;'
  echo '}'
} >"$dir/raw_string.cc"
expect raw_string.cc function 1 91

# A function whose closing brace is not at its indent: reported, not skipped.
{
  echo 'int Unclosed(int x) {'
  body 3 '  '
  echo '  return x; }'
  echo ''
  echo 'int Next() { return 0; }'
} >"$dir/unclosed.cc"
out=$(bash "$guard" --files "$dir/unclosed.cc")
if [[ $? != 1 || $out != *"unclosed.cc:1: block not closed at its indent"* ]]; then
  echo "FAIL: unclosed.cc: expected a block not closed, got: $out"
  failed=1
fi
# A body the guard cannot follow (its first line ends in ';'): its statements are reported.
{
  echo 'int Hidden(int x) { x += 1;'
  body 100 '  '
  echo '  return x;'
  echo '}'
} >"$dir/hidden.cc"
expect hidden.cc lost 102

# Files of 700 and 701 lines.
body 700 '' >"$dir/seven_hundred.cc"
expect seven_hundred.cc ok
body 701 '' >"$dir/seven_hundred_one.cc"
expect seven_hundred_one.cc size 701

# Several files at once: every violation is reported, with each file's name.
out=$(bash "$guard" --files "$dir/multiline_signature.cc" "$dir/eighty.cc" "$dir/main_lambda.cc")
if [[ $? != 1 || $(grep -c 'function of 90 lines' <<<"$out") != 2 ]]; then
  echo "FAIL: several files: got: $out"
  failed=1
fi

if ((failed)); then exit 1; fi
echo "check_layout_test: all cases pass"
