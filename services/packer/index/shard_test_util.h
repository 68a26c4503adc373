// Test shards for the index's tests: encoded images, WAV audio, k.json
// members, and a directory of shards with every kind of member and defect
// the builder meets.
#ifndef TUTTI_SERVICES_PACKER_INDEX_SHARD_TEST_UTIL_H_
#define TUTTI_SERVICES_PACKER_INDEX_SHARD_TEST_UTIL_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

#include "common/tar.h"

namespace tutti::packer::testing {

inline std::string Encode(const std::string& ext, int w, int h) {
  cv::Mat img(h, w, CV_8UC3, cv::Scalar(40, 80, 120));
  std::vector<uchar> buf;
  cv::imencode(ext, img, buf);
  return std::string(buf.begin(), buf.end());
}

// A JPEG whose frame header follows `segments` APP1 segments of 64 KiB, so
// that reading its size takes more than the first 4 KiB (or 64 KiB).
inline std::string JpegWithMetadata(int w, int h, int segments) {
  const std::string jpg = Encode(".jpg", w, h);
  std::string app;
  for (int i = 0; i < segments; ++i) {
    app += "\xFF\xE1";
    app += "\xFF\xFF";  // segment length 65535 (itself included)
    app += std::string(65533, static_cast<char>('a' + i));
  }
  return jpg.substr(0, 2) + app + jpg.substr(2);
}

inline std::string Wav(uint32_t rate, uint32_t frames) {
  auto le32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto le16 = [](uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); };
  const uint32_t data = frames * 2;
  std::string s = "RIFF" + le32(36 + data) + "WAVEfmt " + le32(16) + le16(1) + le16(1) +
                  le32(rate) + le32(rate * 2) + le16(2) + le16(16) + "data" + le32(data);
  s.append(data, '\0');
  return s;
}

inline std::string Ids(int n) {
  std::string s = "{\"input_ids\": [";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(100 + i);
  return s + "]}";
}

// A directory that removes itself.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tutti_index_shards_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

  void Write(const std::string& rel, const std::string& data) const {
    std::filesystem::create_directories(std::filesystem::path(path_ + "/" + rel).parent_path());
    std::ofstream(path_ + "/" + rel, std::ios::binary | std::ios::trunc) << data;
  }
  // Sets a file's modification time (seconds since the epoch), so a test
  // changes a shard without waiting for the clock to move.
  void Touch(const std::string& rel, int64_t seconds) const {
    struct timespec t[2] = {{seconds, 0}, {seconds, 0}};
    ::utimensat(AT_FDCWD, (path_ + "/" + rel).c_str(), t, 0);
  }

 private:
  std::string path_;
};

// A shard of `n` samples with keys from `first`: text-only, images (one with
// a large metadata block before its frame header), audio, a long k.json,
// a long member name, an unknown extension, and corrupt samples.
inline std::string MixedShard(int first, int n) {
  TarWriter t;
  for (int i = first; i < first + n; ++i) {
    const std::string k = "s" + std::to_string(i);
    switch (i % 9) {
      case 0:
        t.Add(k + ".json", Ids(5 + i % 13));
        break;
      case 1:
        t.Add(k + ".json", Ids(7));
        t.Add(k + ".0.jpg", Encode(".jpg", 64 + i, 48));
        t.Add(k + ".1.png", Encode(".png", 30, 20 + i));
        break;
      case 2:
        t.Add(k + ".txt", std::string(100 + i, 'x'));
        t.Add(k + ".webp", Encode(".webp", 33, 44));
        break;
      case 3:
        t.Add(k + ".json", Ids(3));
        t.Add(k + ".jpg", JpegWithMetadata(40, 30, 2));
        break;
      case 4:
        t.Add(k + ".wav", Wav(16000, 8000 + i));
        t.Add(k + ".txt", "hello");
        t.Add(k + ".cls", "3");
        break;
      case 5:
        t.Add(k + ".json", std::string(300000, ' ') + Ids(2));  // spans reads
        break;
      case 6:
        t.Add("a/long/directory/name/that/runs/past/the/ustar/limit/of/one/hundred/bytes/" + k +
                  ".json",
              Ids(4));
        break;
      case 7:
        t.Add(k + ".json", Ids(4));
        t.Add(k + ".jpg", "not a jpeg at all");  // bad_image_header
        break;
      default:
        t.Add(k + ".json", "{\"input_ids\": [1, 2");  // bad_json
        t.Add(k + ".json", Ids(2));                   // and a duplicate
        break;
    }
  }
  return t.Finish();
}

}  // namespace tutti::packer::testing

#endif  // TUTTI_SERVICES_PACKER_INDEX_SHARD_TEST_UTIL_H_
