// Real init work: a sieve of Eratosthenes over PRIMES_LIMIT numbers is built
// once per instance in init (tens of milliseconds and ~20 MB), then each call
// answers from it.
//   curl -d 97 $OPENFAAS_URL/function/primes       -> "97 is prime (25th
//   prime)"
#include <silt/function.h>

#include <cstdlib>
#include <string>
#include <vector>

static std::vector<bool> composite;
static std::vector<unsigned> rank_of;  // number of primes <= n, every 64th n

static void Init(silt::Context& ctx) {
  const char* env = std::getenv("PRIMES_LIMIT");
  size_t limit = env ? std::strtoul(env, nullptr, 10) : 10000000;
  composite.assign(limit + 1, false);
  composite[0] = composite[1] = true;
  for (size_t i = 2; i * i <= limit; ++i)
    if (!composite[i])
      for (size_t j = i * i; j <= limit; j += i) composite[j] = true;
  rank_of.assign(limit / 64 + 1, 0);
  unsigned count = 0;
  for (size_t n = 0; n <= limit; ++n) {
    if (!composite[n]) ++count;
    if (n % 64 == 63 || n == limit) rank_of[n / 64] = count;
  }
  ctx.Log("sieve ready: " + std::to_string(count) + " primes up to " +
          std::to_string(limit));
}

static silt::Response Handle(const silt::Request& req, silt::Context&) {
  std::string text(req.body.empty() ? req.query : req.body);
  char* end = nullptr;
  unsigned long n = std::strtoul(text.c_str(), &end, 10);
  if (end == text.c_str()) return silt::Response::Text(400, "send a number\n");
  if (n >= composite.size())
    return silt::Response::Text(400, "number too large for this sieve\n");
  if (composite[n])
    return silt::Response::Text(200, std::to_string(n) + " is not prime\n");
  unsigned rank = n >= 64 ? rank_of[n / 64 - 1] : 0;
  for (size_t m = n / 64 * 64; m <= n; ++m)
    if (!composite[m]) ++rank;
  return silt::Response::Text(200, std::to_string(n) +
                                       " is prime (prime number " +
                                       std::to_string(rank) + ")\n");
}

SILT_INIT(Init)
SILT_HANDLER(Handle)
