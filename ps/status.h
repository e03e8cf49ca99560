// Status and Result<T>: Tessera's error model. No exceptions cross module boundaries.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tessera {

/// Error codes. Values are part of the wire protocol: never renumber.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kUnavailable = 4,  ///< Retryable: the peer is down or unreachable.
  kDeadlineExceeded = 5,
  kCorruption = 6,
  kIOError = 7,
  kResourceExhausted = 8,
  kInternal = 9,
  kFailedPrecondition = 10,
  kCancelled = 11,
  kPermissionDenied = 12,  ///< The sender lacks the rights the op needs (peer or admin).
  /// Not applied: a sequence check failed (a push whose client the server does not know and
  /// whose number is not its first); the caller resynchronizes and sends it again.
  kAborted = 13,
};

/// Name of a code, e.g. "InvalidArgument".
std::string_view StatusCodeName(StatusCode code);

/// The result of an operation: OK, or a code with a message that says what went wrong.
/// A Status is a small value; copying is cheap. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "OK" or "<CodeName>: <message>".
  std::string ToString() const;
  /// Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;
  /// Explicitly ignores the status (for best-effort cleanup paths).
  void IgnoreError() const {}

  bool operator==(const Status& o) const { return code_ == o.code_ && message_ == o.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {
/// Prints "Result::value() called on an error: <status>" to stderr and aborts. Called by the
/// Result accessors when their precondition (ok()) does not hold.
[[noreturn]] void DieOfBadResultAccess(const Status& status);
}  // namespace internal

/// A value or the Status that explains why there is none. Never throws.
///
/// Accessors: value(), operator* and operator-> require ok(). Called on an error they print
/// the status and abort the process (like Arrow's ValueOrDie), rather than throwing
/// std::bad_variant_access across the API: check ok() first, use TESSERA_ASSIGN_OR_RETURN,
/// or ValueOr() for a fallback.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get_if<Status>(&v_)->ok()) v_ = Status::Internal("Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    const Status* s = std::get_if<Status>(&v_);
    return s == nullptr ? kOk : *s;
  }
  /// The value. Precondition: ok(); otherwise aborts with the status as the message.
  T& value() & { return *Checked(); }
  const T& value() const& { return *Checked(); }
  T&& value() && { return std::move(*Checked()); }
  /// Same as value(): the name says what happens on an error.
  T& ValueOrDie() & { return value(); }
  const T& ValueOrDie() const& { return value(); }
  T&& ValueOrDie() && { return std::move(*this).value(); }
  /// The value, or `fallback` on an error. Never aborts.
  T ValueOr(T fallback) const& { return ok() ? *std::get_if<T>(&v_) : std::move(fallback); }
  T ValueOr(T fallback) && { return ok() ? std::move(*std::get_if<T>(&v_)) : std::move(fallback); }
  T* operator->() { return Checked(); }
  const T* operator->() const { return Checked(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  T* Checked() {
    T* v = std::get_if<T>(&v_);
    if (v == nullptr) internal::DieOfBadResultAccess(*std::get_if<Status>(&v_));
    return v;
  }
  const T* Checked() const {
    const T* v = std::get_if<T>(&v_);
    if (v == nullptr) internal::DieOfBadResultAccess(*std::get_if<Status>(&v_));
    return v;
  }

  std::variant<Status, T> v_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

/// Returns from the enclosing function if `expr` (a Status) is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::tessera::Status _tessera_st = (expr);    \
    if (!_tessera_st.ok()) return _tessera_st; \
  } while (0)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

/// `TESSERA_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(_tessera_res_, __LINE__), lhs, expr)
