#include <gtest/gtest.h>

#include <string>

#include "ps/metrics/http_request_internal.h"

namespace tessera::internal {
namespace {

using State = HttpRequestHead::State;

TEST(HttpRequestHead, CompleteRequestsGiveMethodAndPath) {
  HttpRequestHead h = ParseRequestHead(
      "GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:9100\r\nUser-Agent: Prometheus/2.45\r\n\r\n");
  ASSERT_EQ(h.state, State::kComplete) << h.error;
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.path, "/metrics");
  // LF line ends, HTTP/1.0, no header, a query string (dropped).
  h = ParseRequestHead("HEAD /healthz?probe=1 HTTP/1.0\n\n");
  ASSERT_EQ(h.state, State::kComplete) << h.error;
  EXPECT_EQ(h.method, "HEAD");
  EXPECT_EQ(h.path, "/healthz");
}

// Every prefix of a valid request is incomplete, never bad: a client that sends its request
// in pieces is served.
TEST(HttpRequestHead, EveryPrefixOfAValidRequestIsIncomplete) {
  const std::string r = "GET /readyz HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n";
  for (size_t n = 0; n < r.size(); ++n) {
    const HttpRequestHead h = ParseRequestHead(r.substr(0, n));
    EXPECT_EQ(h.state, State::kIncomplete) << n << " bytes: " << h.error;
  }
  EXPECT_EQ(ParseRequestHead(r).state, State::kComplete);
}

// Wrong request lines are refused as soon as they cannot become valid, with the reason.
TEST(HttpRequestHead, WrongRequestLinesAreBadAtOnce) {
  for (const char* in : {
           "\x16\x03\x01\x02",                     // a TLS ClientHello
           " GET / HTTP/1.1\r\n",                  // no method
           "get / HTTP/1.1\r\n",                   // lower-case method
           "GETTINGSOMETHINGLONG / HTTP/1.1\r\n",  // method over 16 letters
           "GET metrics HTTP/1.1\r\n",             // target without '/'
           "GET /a\x01b HTTP/1.1\r\n",             // control byte in the target
           "GET /\xff HTTP/1.1\r\n",               // non-ASCII byte in the target
           "GET / SPDY",                           // not HTTP, line not even complete
           "GET / HTTP/2.0\r\n",                   // another version
           "GET / HTTP/1.1 extra\r\n",             // a fourth field
           "GET /  HTTP/1.1\r\n",                  // two spaces
       }) {
    const HttpRequestHead h = ParseRequestHead(in);
    EXPECT_EQ(h.state, State::kBad) << testing::PrintToString(std::string(in));
    EXPECT_FALSE(h.error.empty());
  }
}

}  // namespace
}  // namespace tessera::internal
