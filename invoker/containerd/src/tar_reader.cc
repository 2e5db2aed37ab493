#include "tar_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace silt::containerd {
namespace {

constexpr size_t kBlock = 512;

// A NUL-terminated (or full-width) header field.
absl::string_view Field(const char* p, size_t n) {
  return absl::string_view(p, strnlen(p, n));
}

// An octal number field (or GNU base-256 for sizes over 8 GiB).
bool Octal(const char* p, size_t n, uint64_t* out) {
  if (static_cast<unsigned char>(p[0]) & 0x80) {
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | static_cast<unsigned char>(p[i]);
    }
    *out = v;
    return true;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i, any = true) {
    if (v >> 60) return false;
    v = v * 8 + (p[i] - '0');
  }
  *out = v;
  return any;
}

// The "path" record of a pax extended header ("LEN path=VALUE\n" records).
std::string PaxPath(absl::string_view pax) {
  std::string path;
  while (!pax.empty()) {
    size_t space = pax.find(' ');
    size_t len;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtoi(pax.substr(0, space), &len) || len <= space ||
        len > pax.size())
      break;
    absl::string_view record = pax.substr(space + 1, len - space - 1);
    absl::ConsumeSuffix(&record, "\n");
    if (absl::ConsumePrefix(&record, "path=")) path = std::string(record);
    pax.remove_prefix(len);
  }
  return path;
}

std::string Clean(std::string name) {
  absl::string_view v = name;
  while (absl::ConsumePrefix(&v, "./") || absl::ConsumePrefix(&v, "/")) {
  }
  return std::string(v);
}

}  // namespace

TarReader::TarReader(void* gz) : gz_(gz) {}
TarReader::~TarReader() { gzclose(static_cast<gzFile>(gz_)); }

absl::StatusOr<std::unique_ptr<TarReader>> TarReader::Open(
    const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr)
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  gzbuffer(gz, 1 << 20);
  return std::unique_ptr<TarReader>(new TarReader(gz));
}

absl::Status TarReader::ReadExactly(char* buf, size_t n) {
  while (n > 0) {
    int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
    int r = gzread(static_cast<gzFile>(gz_), buf, chunk);
    if (r <= 0) {
      int err = 0;
      const char* why = gzerror(static_cast<gzFile>(gz_), &err);
      return absl::InvalidArgumentError(absl::StrCat(
          "the archive ends early or is corrupt at byte ", offset_,
          err != Z_OK && why != nullptr ? absl::StrCat(" (", why, ")") : ""));
    }
    buf += r;
    n -= r;
    offset_ += r;
  }
  return absl::OkStatus();
}

absl::Status TarReader::Skip(uint64_t n) {
  char buf[64 * 1024];
  while (n > 0) {
    size_t chunk = std::min<uint64_t>(n, sizeof buf);
    if (auto s = ReadExactly(buf, chunk); !s.ok()) return s;
    n -= chunk;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TarReader::Next(Entry* entry) {
  if (auto s = Skip(left_ + padding_); !s.ok()) return s;
  left_ = padding_ = 0;
  std::string long_name;
  for (;;) {
    char h[kBlock];
    uint64_t at = offset_;
    // A clean end: two zero blocks, or (as some writers leave it) the file's
    // end where a header would be.
    int r = gzread(static_cast<gzFile>(gz_), h, kBlock);
    if (r == 0) return false;
    if (r != static_cast<int>(kBlock))
      return absl::InvalidArgumentError(
          absl::StrCat("the archive ends inside a header at byte ", at));
    offset_ += kBlock;
    if (std::all_of(h, h + kBlock, [](char c) { return c == 0; })) return false;
    uint64_t size, checksum;
    if (!Octal(h + 124, 12, &size) || !Octal(h + 148, 8, &checksum))
      return absl::InvalidArgumentError(
          absl::StrCat("not a tar archive (bad header at byte ", at, ")"));
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i)
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    if (sum != checksum)
      return absl::InvalidArgumentError(absl::StrCat(
          "not a tar archive (header checksum wrong at byte ", at, ")"));
    char type = h[156];
    uint64_t pad = (kBlock - size % kBlock) % kBlock;
    if (type == 'L' || type == 'x') {
      // A long name (GNU) or extended header (pax) for the next entry.
      if (size > (1 << 20))
        return absl::InvalidArgumentError(
            absl::StrCat("an extended header of ", size, " bytes at ", at));
      std::string data(size, '\0');
      if (auto s = ReadExactly(data.data(), size); !s.ok()) return s;
      if (auto s = Skip(pad); !s.ok()) return s;
      if (type == 'L')
        long_name = std::string(Field(data.data(), data.size()));
      else if (std::string p = PaxPath(data); !p.empty())
        long_name = p;
      continue;
    }
    if (type == 'g') {  // pax global header: nothing of ours
      if (auto s = Skip(size + pad); !s.ok()) return s;
      continue;
    }
    std::string name;
    if (!long_name.empty()) {
      name = long_name;
    } else {
      absl::string_view prefix = Field(h + 345, 155);
      name = std::string(Field(h, 100));
      if (memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty())
        name = absl::StrCat(prefix, "/", name);
    }
    entry->name = Clean(std::move(name));
    entry->regular = type == '0' || type == '\0' || type == '7';
    entry->size = entry->regular ? size : 0;
    // Links and directories carry no data, but skip what a header says.
    left_ = size;
    padding_ = pad;
    return true;
  }
}

absl::StatusOr<size_t> TarReader::Read(char* buf, size_t n) {
  n = std::min<uint64_t>(n, left_);
  if (n == 0) return 0;
  if (auto s = ReadExactly(buf, n); !s.ok()) return s;
  left_ -= n;
  return n;
}

}  // namespace silt::containerd
