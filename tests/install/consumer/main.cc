// consumer ENDPOINT: the client test of an installed Tessera (plugin.cc does the work).
// consumer --free-port: prints a TCP port of 127.0.0.1 that is free now.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "plugin.h"

namespace {
int PrintFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("consumer: free port");
    return 1;
  }
  std::printf("%d\n", ntohs(a.sin_port));
  close(fd);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer ENDPOINT | consumer --free-port\n");
    return 2;
  }
  if (std::strcmp(argv[1], "--free-port") == 0) return PrintFreePort();
  std::printf("consumer: default request timeout %lld ms (read through the old include form)\n",
              OldIncludeFormRequestTimeoutMs());
  return RunAgainst(argv[1]);
}
