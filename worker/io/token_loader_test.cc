// Tests of TokenLoader: exact windows, shard order and crossing, wrap-around
// with the epoch, Seek, the refusals of Open and Seek, and the shuffled order.
#include "worker/io/token_loader.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "worker/io/test_util.h"
#include "worker/io/token_shard.h"

namespace keel {
namespace {

using testing_util::HasAll;
using testing_util::TestDir;
using Position = TokenLoader::Position;

// A shard holding first, first+1, ..., first+count-1.
void WriteIota(const std::string& path, int first, int count) {
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), static_cast<uint16_t>(first));
  Status s = WriteTokenShard(path, tokens.data(), count);
  ASSERT_TRUE(s.ok()) << s.message();
}

std::vector<int32_t> Range(int first, int count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::unique_ptr<TokenLoader> MustOpen(const std::string& pattern, int64_t batch, int64_t seq) {
  std::unique_ptr<TokenLoader> loader;
  Status s = TokenLoader::Open(pattern, batch, seq, &loader);
  EXPECT_TRUE(s.ok()) << s.message();
  return loader;
}

// A loader over one shard (in a fresh TestDir) holding first .. first+count-1.
std::unique_ptr<TokenLoader> OneShardLoader(int first, int count, int64_t batch, int64_t seq) {
  const std::string path = TestDir() + "/s.bin";
  WriteIota(path, first, count);
  return MustOpen(path, batch, seq);
}

// Writes each shard (name, first, count) as WriteIota into a fresh TestDir and
// returns the directory.
struct IotaShard {
  const char* name;
  int first, count;
};
std::string WriteShards(std::initializer_list<IotaShard> shards) {
  const std::string dir = TestDir();
  for (const IotaShard& shard : shards) WriteIota(dir + "/" + shard.name, shard.first, shard.count);
  return dir;
}

// Next must give inputs first..first+n-1 and targets one further.
void ExpectWindow(TokenLoader* loader, int first) {
  std::vector<int32_t> inputs, targets;
  Status s = loader->Next(&inputs, &targets);
  ASSERT_TRUE(s.ok()) << s.message();
  const int n = static_cast<int>(loader->batch() * loader->seq());
  EXPECT_EQ(inputs, Range(first, n));
  EXPECT_EQ(targets, Range(first + 1, n));
}

TEST(TokenLoaderTest, InputsAndTargetsAreConsecutiveWindows) {
  auto loader = OneShardLoader(0, 100, 2, 4);
  ASSERT_NE(loader, nullptr);
  std::vector<int32_t> inputs, targets;
  ASSERT_TRUE(loader->Next(&inputs, &targets).ok());
  // Row 0 is tokens 0..3 -> 1..4, row 1 is tokens 4..7 -> 5..8.
  EXPECT_EQ(inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(loader->position(), (Position{0, 8, 0}));
  ASSERT_TRUE(loader->Next(&inputs, &targets).ok());
  EXPECT_EQ(inputs, Range(8, 8));
  EXPECT_EQ(targets, Range(9, 8));
  EXPECT_EQ(loader->position(), (Position{0, 16, 0}));
  EXPECT_EQ(loader->total_tokens(), 100);
  EXPECT_EQ(loader->max_token(), 99);
  EXPECT_EQ(loader->num_shards(), 1);
}

TEST(TokenLoaderTest, CrossesShardsInSortedOrderAndWrapsWithTheEpoch) {
  // Written out of order; glob order is by name: a, then b.
  const std::string dir = WriteShards({{"shard_b.bin", 1000, 20}, {"shard_a.bin", 0, 20}});
  auto loader = MustOpen(dir + "/shard_*.bin", 1, 8);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->shard_paths(),
            (std::vector<std::string>{dir + "/shard_a.bin", dir + "/shard_b.bin"}));
  EXPECT_EQ(loader->total_tokens(), 40);
  EXPECT_EQ(loader->max_token(), 1019);
  // 20 tokens hold batches at offsets 0 and 8 (16 + 9 > 20: the tail is skipped).
  ExpectWindow(loader.get(), 0);
  ExpectWindow(loader.get(), 8);
  EXPECT_EQ(loader->position(), (Position{0, 16, 0}));
  ExpectWindow(loader.get(), 1000);
  EXPECT_EQ(loader->position(), (Position{1, 8, 0}));
  ExpectWindow(loader.get(), 1008);
  ExpectWindow(loader.get(), 0);
  EXPECT_EQ(loader->position(), (Position{0, 8, 1}));
  ExpectWindow(loader.get(), 8);
  ExpectWindow(loader.get(), 1000);
  ExpectWindow(loader.get(), 1008);
  ExpectWindow(loader.get(), 0);
  EXPECT_EQ(loader->position(), (Position{0, 8, 2}));
}

TEST(TokenLoaderTest, ShardOfExactlyOneBatchGivesOneBatch) {
  auto loader = OneShardLoader(5, 9, 2, 4);
  ASSERT_NE(loader, nullptr);
  ExpectWindow(loader.get(), 5);
  ExpectWindow(loader.get(), 5);
  EXPECT_EQ(loader->position(), (Position{0, 8, 1}));
}

TEST(TokenLoaderTest, SeekThenNextContinuesLikeAnUninterruptedLoader) {
  const std::string dir = WriteShards({{"s0.bin", 0, 30}, {"s1.bin", 100, 23}, {"s2.bin", 200, 17}});
  const std::string pattern = dir + "/s?.bin";
  auto reference = MustOpen(pattern, 2, 3);
  ASSERT_NE(reference, nullptr);
  const int kSteps = 20;  // several epochs
  std::vector<Position> positions;
  std::vector<std::vector<int32_t>> inputs(kSteps), targets(kSteps);
  for (int i = 0; i < kSteps; ++i) {
    positions.push_back(reference->position());
    ASSERT_TRUE(reference->Next(&inputs[i], &targets[i]).ok());
  }
  EXPECT_GE(reference->position().epoch, 2);
  for (int k = 0; k < kSteps; ++k) {
    auto resumed = MustOpen(pattern, 2, 3);
    ASSERT_NE(resumed, nullptr);
    ASSERT_TRUE(resumed->Seek(positions[k]).ok());
    EXPECT_EQ(resumed->position(), positions[k]);
    for (int i = k; i < kSteps; ++i) {
      std::vector<int32_t> in, tg;
      ASSERT_TRUE(resumed->Next(&in, &tg).ok());
      ASSERT_EQ(in, inputs[i]) << "resumed at step " << k << ", step " << i;
      ASSERT_EQ(tg, targets[i]) << "resumed at step " << k << ", step " << i;
    }
    EXPECT_EQ(resumed->position(), reference->position());
  }
}

TEST(TokenLoaderTest, SeekToAnyOffsetWorksWithAnotherBatchSize) {
  auto loader = OneShardLoader(0, 50, 1, 4);
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->Seek(Position{0, 13, 3}).ok());
  ExpectWindow(loader.get(), 13);
  EXPECT_EQ(loader->position(), (Position{0, 17, 3}));
  // Seeking to the end: the next batch comes from the start, next epoch.
  ASSERT_TRUE(loader->Seek(Position{0, 50, 0}).ok());
  ExpectWindow(loader.get(), 0);
  EXPECT_EQ(loader->position(), (Position{0, 4, 1}));
}

TEST(TokenLoaderTest, SeekRefusesPositionsOutsideTheShards) {
  const std::string dir = WriteShards({{"a.bin", 0, 20}, {"b.bin", 0, 30}});
  auto loader = MustOpen(dir + "/*.bin", 1, 4);
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->Seek(Position{1, 30, 0}).ok());
  const Position before = loader->position();
  struct Case {
    Position position;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {{-1, 0, 0}, {"shard -1", "[0, 2)"}},
      {{2, 0, 0}, {"shard 2", "[0, 2)"}},
      {{0, 21, 0}, {"offset 21", "[0, 20]", dir + "/a.bin"}},
      {{0, -1, 0}, {"offset -1"}},
      {{0, 0, -1}, {"epoch -1", ">= 0"}},
  };
  for (const Case& c : cases) {
    Status s = loader->Seek(c.position);
    ASSERT_FALSE(s.ok());
    for (const std::string& part : c.parts) EXPECT_TRUE(HasAll(s.message(), {part}));
    EXPECT_EQ(loader->position(), before);
  }
}

TEST(TokenLoaderTest, OpenRefusesAShardTooSmallForOneBatch) {
  const std::string dir = WriteShards({{"a.bin", 0, 100}, {"b.bin", 0, 8}});
  std::unique_ptr<TokenLoader> loader;
  Status s = TokenLoader::Open(dir + "/*.bin", 2, 4, &loader);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/b.bin", "has 8 tokens", "9", "batch 2", "seq 4"}));
  EXPECT_EQ(loader, nullptr);
  // One more token is enough.
  WriteIota(dir + "/b.bin", 0, 9);
  EXPECT_TRUE(TokenLoader::Open(dir + "/*.bin", 2, 4, &loader).ok());
}

TEST(TokenLoaderTest, OpenRefusesAPatternMatchingNothing) {
  const std::string dir = WriteShards({{"train_000.bin", 0, 100}});
  std::unique_ptr<TokenLoader> loader;
  Status s = TokenLoader::Open(dir + "/val_*.bin", 1, 4, &loader);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"no file matches", dir + "/val_*.bin"}));
  s = TokenLoader::Open(dir + "/missing.bin", 1, 4, &loader);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"no file matches", dir + "/missing.bin"}));
  EXPECT_EQ(loader, nullptr);
}

TEST(TokenLoaderTest, OpenRefusesBadShapesAndBadShards) {
  const std::string dir = WriteShards({{"s.bin", 0, 100}});
  std::unique_ptr<TokenLoader> loader;
  Status s = TokenLoader::Open(dir + "/s.bin", 0, 4, &loader);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"batch 0", ">= 1"}));
  EXPECT_FALSE(TokenLoader::Open(dir + "/s.bin", 4, -1, &loader).ok());
  EXPECT_FALSE(TokenLoader::Open(dir + "/s.bin", int64_t{1} << 40, int64_t{1} << 40, &loader).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/t.bin", std::string(2000, 'x')).ok());
  s = TokenLoader::Open(dir + "/*.bin", 1, 4, &loader);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/t.bin", "magic"}));
}

TEST(TokenLoaderTest, NextReportsAShardThatChangedSinceOpen) {
  const std::string dir = WriteShards({{"a.bin", 0, 10}, {"b.bin", 0, 10}});
  auto loader = MustOpen(dir + "/*.bin", 1, 4);
  ASSERT_NE(loader, nullptr);
  ExpectWindow(loader.get(), 0);
  ExpectWindow(loader.get(), 4);
  WriteIota(dir + "/b.bin", 0, 12);
  const Position before = loader->position();
  std::vector<int32_t> inputs, targets;
  Status s = loader->Next(&inputs, &targets);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/b.bin", "now has 12", "had 10"}));
  EXPECT_EQ(loader->position(), before);
}

TEST(TokenLoaderTest, MaxTokenIsTheLargestIdInAnyShard) {
  const std::string dir = TestDir();
  std::vector<uint16_t> a(50, 3), b(50, 4);
  a[17] = 50256;
  b[49] = 60000;
  ASSERT_TRUE(WriteTokenShard(dir + "/a.bin", a.data(), 50).ok());
  auto loader = MustOpen(dir + "/a.bin", 1, 4);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->max_token(), 50256);
  ASSERT_TRUE(WriteTokenShard(dir + "/b.bin", b.data(), 50).ok());
  loader = MustOpen(dir + "/*.bin", 1, 4);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->max_token(), 60000);
  EXPECT_EQ(loader->total_tokens(), 100);
}

// The shuffled order's batches from an iota shard set: each row is one sample,
// so row b's first input token names the sample (value - shard's first token
// = start offset, a multiple of seq).
std::vector<std::vector<int32_t>> ShuffledRows(TokenLoader* loader, int batches) {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> in, tg;
  const int64_t seq = loader->seq();
  for (int i = 0; i < batches; ++i) {
    Status s = loader->Next(&in, &tg);
    EXPECT_TRUE(s.ok()) << s.message();
    for (int64_t b = 0; b < loader->batch(); ++b) {
      rows.emplace_back(in.begin() + b * seq, in.begin() + (b + 1) * seq);
      // Each row is a window of consecutive tokens, its targets one further.
      for (int64_t t = 0; t < seq; ++t) {
        EXPECT_EQ(in[static_cast<size_t>(b * seq + t)], rows.back()[0] + t);
        EXPECT_EQ(tg[static_cast<size_t>(b * seq + t)], rows.back()[0] + t + 1);
      }
    }
  }
  return rows;
}

TEST(TokenLoaderTest, ShuffledOrderReadsEverySampleOnceAnEpochInAnotherOrder) {
  // One shard of 4 * 8 * 4 + 1 tokens: 32 samples of seq 4, 8 batches of 4.
  std::unique_ptr<TokenLoader> loader = OneShardLoader(0, 129, 4, 4);
  loader->Shuffle(7);
  EXPECT_TRUE(loader->shuffled());
  std::vector<std::vector<int32_t>> rows = ShuffledRows(loader.get(), 8);
  std::set<int32_t> starts;
  std::vector<int32_t> order;
  for (const auto& row : rows) {
    EXPECT_EQ(row[0] % 4, 0);
    starts.insert(row[0]);
    order.push_back(row[0]);
  }
  EXPECT_EQ(starts.size(), 32u);                        // all 32 samples, none twice
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));  // not llm.c's order
  EXPECT_EQ(loader->position().epoch, 0);
  // The next epoch reads them all again, in another order.
  std::vector<std::vector<int32_t>> second = ShuffledRows(loader.get(), 8);
  EXPECT_EQ(loader->position().epoch, 1);
  std::vector<int32_t> order2;
  for (const auto& row : second) order2.push_back(row[0]);
  EXPECT_NE(order, order2);
  std::sort(order2.begin(), order2.end());
  EXPECT_EQ(std::set<int32_t>(order2.begin(), order2.end()), starts);
}

TEST(TokenLoaderTest, ShuffledOrderIsFixedByTheSeed) {
  const std::string dir = WriteShards({{"a.bin", 0, 401}, {"b.bin", 1000, 401}, {"c.bin", 2000, 401}});
  auto first = MustOpen(dir + "/*.bin", 5, 8);
  auto same = MustOpen(dir + "/*.bin", 5, 8);
  auto other = MustOpen(dir + "/*.bin", 5, 8);
  first->Shuffle(42);
  same->Shuffle(42);
  other->Shuffle(43);
  // 3 shards x 50 samples of 8 = 30 batches of 5 an epoch: read two epochs.
  std::vector<std::vector<int32_t>> a = ShuffledRows(first.get(), 60);
  EXPECT_EQ(a, ShuffledRows(same.get(), 60));
  EXPECT_NE(a, ShuffledRows(other.get(), 60));
  // Each shard's 10 batches come together: the shard changes only every 10 batches.
  int changes = 0;
  for (size_t i = 5; i < a.size(); i += 5) changes += (a[i][0] / 1000 != a[i - 5][0] / 1000);
  EXPECT_LE(changes, 5);
}

TEST(TokenLoaderTest, ShuffledSeekThenNextContinuesLikeAnUninterruptedLoader) {
  const std::string dir = WriteShards({{"a.bin", 0, 161}, {"b.bin", 1000, 161}});
  auto uninterrupted = MustOpen(dir + "/*.bin", 2, 8);
  uninterrupted->Shuffle(3);
  std::vector<int32_t> in, tg;
  for (int i = 0; i < 23; ++i) ASSERT_TRUE(uninterrupted->Next(&in, &tg).ok());  // into epoch 1
  const Position saved = uninterrupted->position();
  EXPECT_EQ(saved.epoch, 1);
  // A fresh loader, shuffled with the same seed, sought to the saved position,
  // gives the same batches, as a trainer resuming from a checkpoint.
  auto resumed = MustOpen(dir + "/*.bin", 2, 8);
  resumed->Shuffle(3);
  ASSERT_TRUE(resumed->Seek(saved).ok());
  EXPECT_EQ(ShuffledRows(resumed.get(), 20), ShuffledRows(uninterrupted.get(), 20));
  // The samples do not depend on the batch size: 4 batches of 2 = 2 batches of 4.
  auto twos = MustOpen(dir + "/*.bin", 2, 8);
  auto fours = MustOpen(dir + "/*.bin", 4, 8);
  twos->Shuffle(5);
  fours->Shuffle(5);
  EXPECT_EQ(ShuffledRows(twos.get(), 4), ShuffledRows(fours.get(), 2));
}

TEST(TokenLoaderTest, ShuffledSeekRefusesAnOffsetBetweenSamples) {
  std::unique_ptr<TokenLoader> loader = OneShardLoader(0, 129, 4, 4);
  loader->Shuffle(1);
  Position p;
  p.offset = 6;  // llm.c's order could save this (batch 3 x seq 2); samples of 4 cannot
  Status s = loader->Seek(p);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"seek offset 6", "not a multiple of seq 4", "data.shuffle"})) << s.message();
  EXPECT_EQ(loader->position(), Position());
}

}  // namespace
}  // namespace keel
