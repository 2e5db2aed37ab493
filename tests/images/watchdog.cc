// A stand-in for OpenFaaS's watchdogs, for test images (this machine reaches
// no registry to fetch the real ones). It listens on :8080 (or $port) and
// answers GET /_/health with 200 once started. Two modes, as the real ones:
//  - classic (default, fwatchdog): runs $fprocess once per request with the
//    request body on stdin and the request in Http_* variables (Http_Method,
//    Http_Path, Http_Query, Http_ContentLength, Http_<Header>), answering
//    with its stdout (200), or 500 and its stderr when it fails;
//  - mode=http (of-watchdog): starts $fprocess once, a server listening at
//    $upstream_url, and passes each request to it and its answer back as
//    the server writes it; healthy once the server takes connections; when
//    the server exits, so does the watchdog ("Forked function has
//    terminated").
// `watchdog echo-server [PORT [INIT_MS [INIT_MIB]]]` is such a server for
// the tests (after an init of INIT_MIB of state and INIT_MS): it listens on
// PORT ($port) and answers with the request: status from X-Status (200),
// X-Echo: "METHOD PATH QUERY", each X-* request header back as X-Echo-*, the
// body as sent, its Content-Type. GET /alloc?mib=N first fills N MiB (to meet a
// memory limit). Built static (tests/CMakeLists.txt) so it runs in a root of
// its own.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

bool ReadAll(int fd, std::string* out) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
  }
}

bool WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

void Respond(int fd, int code, const std::string& body) {
  const char* reason = code == 200   ? "OK"
                       : code == 400 ? "Bad Request"
                                     : "Internal Server Error";
  WriteAll(fd, "HTTP/1.1 " + std::to_string(code) + " " + reason +
                   "\r\nContent-Type: text/plain\r\nContent-Length: " +
                   std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body);
}

// Runs fprocess with `input` on stdin and `env` added: exit status, output.
int Run(const std::vector<std::string>& env, const std::string& input,
        std::string* out, std::string* err) {
  const char* fprocess = getenv("fprocess");
  if (fprocess == nullptr || *fprocess == '\0') {
    *err = "fprocess is not set\n";
    return 1;
  }
  std::vector<std::string> argv;
  std::istringstream words(fprocess);
  for (std::string w; words >> w;) argv.push_back(w);
  if (argv.empty()) {
    *err = "fprocess is empty\n";
    return 1;
  }
  // Everything the child needs is made before fork (other threads run).
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& kv : env) envp.push_back(const_cast<char*>(kv.c_str()));
  envp.push_back(nullptr);
  int in[2], o[2], e[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(o, O_CLOEXEC) != 0 ||
      pipe2(e, O_CLOEXEC) != 0)
    return 1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    execvpe(args[0], args.data(), envp.data());
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(o[1]);
  close(e[1]);
  std::thread writer([&] {
    WriteAll(in[1], input);
    close(in[1]);
  });
  std::thread errors([&] { ReadAll(e[0], err); });
  ReadAll(o[0], out);
  writer.join();
  errors.join();
  close(o[0]);
  close(e[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One request read whole (head and a Content-Length body): false when the
// peer went away first.
struct Request {
  std::string head, body, method, target;
  std::string path, query;  // the target's, split at '?'
  std::vector<std::pair<std::string, std::string>> headers;
};
bool ReadRequest(int fd, Request* r) {
  std::string data;
  size_t end;
  char buf[65536];
  while ((end = data.find("\r\n\r\n")) == std::string::npos) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0 || data.size() > (1 << 20)) return false;
    data.append(buf, static_cast<size_t>(n));
  }
  r->head = data.substr(0, end + 4);
  r->body = data.substr(end + 4);
  std::istringstream head(data.substr(0, end));
  std::string version, line;
  head >> r->method >> r->target >> version;
  size_t q = r->target.find('?');
  r->path = r->target.substr(0, q);
  if (q != std::string::npos) r->query = r->target.substr(q + 1);
  std::getline(head, line);
  size_t length = 0;
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon), value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(tolower(c));
    if (lower == "content-length")
      length = strtoull(value.c_str(), nullptr, 10);
    r->headers.emplace_back(name, value);
  }
  while (r->body.size() < length) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    r->body.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// Classic mode: one request, fprocess run for it.
void Serve(int fd) {
  Request r;
  if (!ReadRequest(fd, &r)) {
    close(fd);
    return;
  }
  const std::string &path = r.path, &query = r.query;
  if (path == "/_/health") {
    Respond(fd, 200, "OK");
    close(fd);
    return;
  }
  std::vector<std::string> env;
  for (auto [name, value] : r.headers) {
    for (char& c : name)
      if (c == '-') c = '_';
    env.push_back("Http_" + name + "=" + value);
  }
  env.push_back("Http_Method=" + r.method);
  env.push_back("Http_Path=" + path);
  env.push_back("Http_ContentLength=" + std::to_string(r.body.size()));
  if (!query.empty()) env.push_back("Http_Query=" + query);
  std::string out, err;
  int code = Run(env, r.body, &out, &err);
  if (!err.empty()) fprintf(stderr, "%s", err.c_str());
  if (code != 0)
    Respond(fd, 500, err.empty() ? "exit status " + std::to_string(code) : err);
  else
    Respond(fd, 200, out);
  close(fd);
}

int Listen(int port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(s, 128) != 0) {
    perror("watchdog: listen");
    exit(1);
  }
  return s;
}

void EchoOne(int fd) {
  Request r;
  if (!ReadRequest(fd, &r)) {
    close(fd);
    return;
  }
  const std::string &path = r.path, &query = r.query;
  if (path == "/alloc") {
    size_t mib =
        strtoull(query.substr(query.find('=') + 1).c_str(), nullptr, 10);
    char* p = static_cast<char*>(malloc(mib << 20));
    for (size_t i = 0; p != nullptr && i < (mib << 20); i += 4096) p[i] = 1;
    free(p);
  }
  std::string status = "200", extra, type = "application/octet-stream";
  for (const auto& [name, value] : r.headers) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(tolower(c));
    if (lower == "x-status")
      status = value;
    else if (lower == "content-type")
      type = value;
    else if (lower.rfind("x-", 0) == 0)
      extra += "X-Echo-" + name.substr(2) + ": " + value + "\r\n";
  }
  WriteAll(fd, "HTTP/1.1 " + status + " Echo\r\nX-Echo: " + r.method + " " +
                   path + " " + query + "\r\n" + extra +
                   "Content-Type: " + type +
                   "\r\nContent-Length: " + std::to_string(r.body.size()) +
                   "\r\nConnection: close\r\n\r\n" + r.body);
  close(fd);
}

// The value of header `name` (case-insensitive), "" when absent.
std::string HeaderOf(const std::string& head, const std::string& name) {
  std::istringstream in(head);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t colon = line.find(':');
    if (colon == std::string::npos || colon != name.size()) continue;
    if (strncasecmp(line.c_str(), name.c_str(), colon) != 0) continue;
    std::string v = line.substr(colon + 1);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }
  return "";
}

// mode=http: the requests of one connection (kept alive, as of-watchdog's
// server does), each to the upstream server on a connection of its own and
// its answer back: whole when sized, else as it comes until the server
// closes (then this connection closes too).
void ProxyConnection(int fd, const sockaddr_in& upstream) {
  for (;;) {
    Request r;
    if (!ReadRequest(fd, &r)) break;
    if (r.target == "/_/health") {
      Respond(fd, 200, "OK");
      break;
    }
    bool keep = strcasecmp(HeaderOf(r.head, "Connection").c_str(), "close");
    int u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(u, reinterpret_cast<const sockaddr*>(&upstream),
                sizeof upstream) != 0) {
      close(u);
      WriteAll(fd,
               "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
               "Connection: close\r\n\r\n");
      break;
    }
    WriteAll(u, r.head + r.body);
    shutdown(u, SHUT_WR);
    std::string data;
    size_t end;
    char buf[65536];
    while ((end = data.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = read(u, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      data.append(buf, static_cast<size_t>(n));
    }
    std::string length = end == std::string::npos
                             ? ""
                             : HeaderOf(data.substr(0, end), "Content-Length");
    if (!keep || length.empty()) {
      // As it comes, to the end.
      bool ok = WriteAll(fd, data);
      for (ssize_t n; ok && (n = read(u, buf, sizeof buf)) > 0;)
        ok = WriteAll(fd, std::string(buf, static_cast<size_t>(n)));
      close(u);
      break;
    }
    // Sized: the head without its Connection, the body, and the next
    // request on this connection.
    std::string head;
    std::istringstream lines(data.substr(0, end + 2));
    for (std::string line; std::getline(lines, line);)
      if (strncasecmp(line.c_str(), "Connection:", 11) != 0)
        head += line + "\n";
    head += "Connection: keep-alive\r\n\r\n";
    std::string body = data.substr(end + 4);
    size_t want = strtoull(length.c_str(), nullptr, 10);
    while (body.size() < want) {
      ssize_t n = read(u, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      body.append(buf, static_cast<size_t>(n));
    }
    close(u);
    if (body.size() < want || !WriteAll(fd, head + body)) break;
  }
  close(fd);
}

int HttpMode(int port) {
  const char* fprocess = getenv("fprocess");
  const char* url = getenv("upstream_url");
  if (fprocess == nullptr || url == nullptr) {
    fprintf(stderr, "watchdog: mode=http needs fprocess and upstream_url\n");
    return 1;
  }
  std::string u = url;  // http://127.0.0.1:8082
  if (u.rfind("http://", 0) == 0) u = u.substr(7);
  sockaddr_in upstream{};
  upstream.sin_family = AF_INET;
  size_t colon = u.find(':');
  upstream.sin_port = htons(static_cast<uint16_t>(
      colon == std::string::npos ? 80 : atoi(u.c_str() + colon + 1)));
  inet_pton(AF_INET, u.substr(0, colon).c_str(), &upstream.sin_addr);
  std::vector<std::string> argv;
  std::istringstream words(fprocess);
  for (std::string w; words >> w;) argv.push_back(w);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t child = fork();
  if (child == 0) {
    execvp(args[0], args.data());
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  std::thread([child] {
    int status = 0;
    waitpid(child, &status, 0);
    fprintf(stderr, "Forked function has terminated: %s %d\n",
            WIFSIGNALED(status) ? "signal" : "status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    _exit(1);
  }).detach();
  // Healthy (listening) once the server takes connections.
  for (;;) {
    int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool up = connect(t, reinterpret_cast<sockaddr*>(&upstream),
                      sizeof upstream) == 0;
    close(t);
    if (up) break;
    usleep(2000);
  }
  int s = Listen(port);
  fprintf(stderr, "watchdog: mode=http on :%d, upstream %s\n", port, url);
  for (;;) {
    int fd = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::thread(ProxyConnection, fd, upstream).detach();
  }
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  int port = getenv("port") ? atoi(getenv("port")) : 8080;
  if (argc > 1 && std::string(argv[1]) == "echo-server") {
    // An init before it listens, as an app's imports take: INIT_MIB of
    // state built, then INIT_MS more.
    if (argc > 4) {
      size_t mib = strtoull(argv[4], nullptr, 10);
      char* state = static_cast<char*>(malloc(mib << 20));
      for (size_t i = 0; state != nullptr && i < (mib << 20); i += 4096)
        state[i] = static_cast<char>(i);
    }
    if (argc > 3) usleep(static_cast<useconds_t>(atoi(argv[3])) * 1000);
    int s = Listen(argc > 2 ? atoi(argv[2]) : port);
    for (;;) {
      int fd = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) EchoOne(fd);
    }
  }
  if (getenv("mode") != nullptr && std::string(getenv("mode")) == "http")
    return HttpMode(port);
  int s = Listen(port);
  fprintf(stderr, "watchdog: listening on :%d, fprocess=%s\n", port,
          getenv("fprocess") ? getenv("fprocess") : "");
  for (;;) {
    int fd = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::thread(Serve, fd).detach();
  }
}
