// The plot as a reader sees it: the 20-run synthetic sweep (plot_testing.h)
// laid out and written as `keel plot` does, rendered to PNG by rsvg-convert
// (Debian: librsvg2-bin), and the pixels checked against the layout: the PNG
// is the SVG's declared size, each legend swatch has its run's colour, each
// text left ink inside its box and none beside it (the monospace width
// estimate holds for the installed font), and the intervention lines stand at
// the step where the rollbacks were decided, not at the step they went back to.
// The SVG and PNG are left in $TEST_UNDECLARED_OUTPUTS_DIR for a person to
// look at.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "client/plot.h"
#include "client/plot_testing.h"

namespace keel {
namespace client {
namespace {

std::string FindRsvgConvert() {
  std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";  // Bazel may hand tests a short PATH
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/rsvg-convert";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string OutputDir() {
  for (const char* name : {"TEST_UNDECLARED_OUTPUTS_DIR", "TEST_TMPDIR"}) {
    const char* dir = std::getenv(name);
    if (dir != nullptr && *dir != '\0') return dir;
  }
  return "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// An 8-bit RGB or RGBA PNG, decoded to RGBA.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgba;
  const uint8_t* At(int x, int y) const { return &rgba[(static_cast<size_t>(y) * width + x) * 4]; }
};

uint32_t BigEndian32(const std::string& bytes, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 3]));
}

// "" or what is wrong. Enough PNG for rsvg-convert's output: 8-bit RGB(A),
// not interlaced.
std::string DecodePng(const std::string& bytes, Image* image) {
  if (bytes.size() < 8 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return "no PNG signature";
  std::string idat;
  int channels = 0;
  for (size_t at = 8; at + 12 <= bytes.size();) {
    const uint32_t length = BigEndian32(bytes, at);
    const std::string type = bytes.substr(at + 4, 4);
    if (at + 12 + length > bytes.size()) return "chunk " + type + " runs past the end";
    const size_t data = at + 8;
    if (type == "IHDR") {
      image->width = static_cast<int>(BigEndian32(bytes, data));
      image->height = static_cast<int>(BigEndian32(bytes, data + 4));
      const int depth = static_cast<uint8_t>(bytes[data + 8]);
      const int color = static_cast<uint8_t>(bytes[data + 9]);
      const int interlace = static_cast<uint8_t>(bytes[data + 12]);
      if (depth != 8 || (color != 6 && color != 2) || interlace != 0)
        return "unsupported PNG: depth " + std::to_string(depth) + ", colour type " + std::to_string(color) +
               ", interlace " + std::to_string(interlace);
      channels = color == 6 ? 4 : 3;
    } else if (type == "IDAT") {
      idat.append(bytes, data, length);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + length;
  }
  if (channels == 0) return "no IHDR";
  const size_t stride = static_cast<size_t>(image->width) * channels;
  std::vector<uint8_t> raw((stride + 1) * image->height);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_size != raw.size())
    return "IDAT does not inflate to " + std::to_string(raw.size()) + " bytes";
  std::vector<uint8_t> pixels(stride * image->height);
  for (int y = 0; y < image->height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &pixels[y * stride];
    const uint8_t* up = y > 0 ? &pixels[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? out[i - channels] : 0;
      const int b = up ? up[i] : 0;
      const int c = up && i >= static_cast<size_t>(channels) ? up[i - channels] : 0;
      int predictor;
      switch (filter) {
        case 0: predictor = 0; break;
        case 1: predictor = a; break;
        case 2: predictor = b; break;
        case 3: predictor = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: return "row " + std::to_string(y) + " has filter " + std::to_string(filter);
      }
      out[i] = static_cast<uint8_t>(in[i] + predictor);
    }
  }
  image->rgba.resize(static_cast<size_t>(image->width) * image->height * 4);
  for (size_t p = 0; p < static_cast<size_t>(image->width) * image->height; ++p) {
    for (int k = 0; k < 3; ++k) image->rgba[p * 4 + k] = pixels[p * channels + k];
    image->rgba[p * 4 + 3] = channels == 4 ? pixels[p * channels + 3] : 255;
  }
  return "";
}

// Text and black lines are dark; the light grid (#e3e3e3) and antialiasing
// fringes far from a glyph are not.
bool Ink(const Image& image, int x, int y) {
  const uint8_t* p = image.At(x, y);
  return p[3] > 128 && std::min({p[0], p[1], p[2]}) < 160;
}

// Pixels of [x0, x1) x [y0, y1), clipped to the image, that are ink.
int InkIn(const Image& image, double x0, double x1, double y0, double y1) {
  const int left = std::max(0, static_cast<int>(std::floor(x0)));
  const int right = std::min(image.width, static_cast<int>(std::ceil(x1)));
  const int top = std::max(0, static_cast<int>(std::floor(y0)));
  const int bottom = std::min(image.height, static_cast<int>(std::ceil(y1)));
  int count = 0;
  for (int y = top; y < bottom; ++y)
    for (int x = left; x < right; ++x) count += Ink(image, x, y);
  return count;
}

// Fraction of the chart's pixel rows where a column within 1 pixel of x is
// not background (anything but white or the light grid).
double ColumnCoverage(const Image& image, const Box& chart, double x) {
  int covered = 0, rows = 0;
  for (int y = static_cast<int>(chart.y) + 2; y < static_cast<int>(chart.bottom()) - 1; ++y) {
    ++rows;
    bool any = false;
    for (int dx = -1; dx <= 1; ++dx) {
      const uint8_t* p = image.At(static_cast<int>(std::floor(x)) + dx, y);
      any = any || std::min({p[0], p[1], p[2]}) < 200;
    }
    covered += any;
  }
  return rows > 0 ? static_cast<double>(covered) / rows : 0;
}

int HexByte(const std::string& color, size_t at) { return std::stoi(color.substr(at, 2), nullptr, 16); }

class PlotRenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sweep_ = MakeSyntheticSweep(20);
    plot_ = LayOutLossPlot("sweep sweep-1 (demo): loss vs step", sweep_.series, sweep_.events);
    svg_ = LossPlotSvg(plot_);
    svg_path_ = OutputDir() + "/plot20.svg";
    png_path_ = OutputDir() + "/plot20.png";
    std::ofstream(svg_path_, std::ios::binary) << svg_;
  }

  // Renders svg_path_ to png_path_; "" or what went wrong.
  std::string Render() {
    const std::string tool = FindRsvgConvert();
    if (tool.empty())
      return "rsvg-convert not found on PATH or in /usr/bin: install Debian's librsvg2-bin "
             "(scripts/install-deps does), it renders the plot for this test";
    const std::string errors = OutputDir() + "/rsvg-convert.stderr";
    const std::string command =
        "'" + tool + "' -f png -o '" + png_path_ + "' '" + svg_path_ + "' 2> '" + errors + "'";
    const int status = std::system(command.c_str());
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return "rsvg-convert failed (status " + std::to_string(status) + "): " + ReadAll(errors);
    return "";
  }

  SyntheticSweep sweep_;
  LossPlot plot_;
  std::string svg_, svg_path_, png_path_;
};

TEST_F(PlotRenderTest, TheSvgIsWhatKeelPlotWritesAndItsLayoutIsSound) {
  EXPECT_EQ(svg_, RenderLossSvg("sweep sweep-1 (demo): loss vs step", sweep_.series, sweep_.events));
  EXPECT_EQ(LayoutProblems(plot_), "");
}

TEST_F(PlotRenderTest, RendersAtTheDeclaredSizeWithLegibleText) {
  ASSERT_EQ(Render(), "");
  Image image;
  ASSERT_EQ(DecodePng(ReadAll(png_path_), &image), "");

  std::smatch size;
  ASSERT_TRUE(std::regex_search(svg_, size, std::regex("<svg [^>]*width=\"([0-9]+)\" height=\"([0-9]+)\"")));
  EXPECT_EQ(image.width, std::stoi(size[1]));
  EXPECT_EQ(image.height, std::stoi(size[2]));
  EXPECT_EQ(image.width, plot_.width);
  EXPECT_EQ(image.height, plot_.height);

  // Each legend swatch is its run's colour: the 3-unit stroke on a whole-pixel
  // y covers the pixel row below it entirely, and every dash pattern starts
  // with at least 2 units drawn.
  for (const PlotLine& line : plot_.lines) {
    const int x = static_cast<int>(std::floor(line.swatch_x)) + 1;
    const int y = static_cast<int>(line.swatch_y);
    const uint8_t* p = image.At(x, y);
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(p[k], HexByte(line.color, 1 + 2 * k), 3) << line.run_id << " swatch at " << x << "," << y;
  }

  // Every text left ink inside its box and none just beyond the side(s) it
  // grows towards: the layout's width estimate holds for the font rendered.
  int checked = 0;
  for (const PlotText& t : plot_.texts) {
    if (t.vertical || !t.frame.empty()) continue;
    const Box& b = t.box;
    EXPECT_GT(InkIn(image, b.x, b.right(), b.y, b.bottom()), 0) << t.role << " \"" << t.text << "\" left no ink";
    if (t.anchor != TextAnchor::kEnd)
      EXPECT_EQ(InkIn(image, b.right() + 1, b.right() + 7, b.y, b.bottom()), 0)
          << t.role << " \"" << t.text << "\" reaches past the right of its box";
    if (t.anchor != TextAnchor::kStart)
      EXPECT_EQ(InkIn(image, b.x - 7, b.x - 1, b.y, b.bottom()), 0)
          << t.role << " \"" << t.text << "\" reaches past the left of its box";
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST_F(PlotRenderTest, RollbackMarkersStandWhereTheRollbacksWereDecided) {
  // In the layout and in the SVG: at from_step (155), not at the target (100).
  const double decided = plot_.XOfStep(kSyntheticRollbackFrom);
  const double target = plot_.XOfStep(kSyntheticRollbackTo);
  char decided_x[32];
  std::snprintf(decided_x, sizeof(decided_x), "%.2f", decided);
  int rollbacks = 0;
  for (const PlotMarker& m : plot_.markers) {
    if (m.intervention.resumed_step != kSyntheticRollbackTo) continue;
    ++rollbacks;
    EXPECT_DOUBLE_EQ(m.x, decided);
    const std::string group = "<g class=\"marker\" data-run=\"" + m.intervention.run_id + "\" data-step=\"" +
                              std::to_string(kSyntheticRollbackFrom) + "\"";
    const size_t at = svg_.find(group);
    ASSERT_NE(at, std::string::npos) << group;
    EXPECT_EQ(svg_.compare(svg_.find("<line x1=\"", at) + 10, std::string(decided_x).size(), decided_x), 0);
  }
  EXPECT_EQ(rollbacks, 6);
  EXPECT_EQ(svg_.find("data-step=\"" + std::to_string(kSyntheticRollbackTo) + "\" stroke="), std::string::npos);

  // In the pixels: the dashed lines cover the column at step 155 from top to
  // bottom (dashes 5 on, 4 off); at step 100 only the runs' lines and the
  // switch shapes cross it.
  ASSERT_EQ(Render(), "");
  Image image;
  ASSERT_EQ(DecodePng(ReadAll(png_path_), &image), "");
  const double at_decided = ColumnCoverage(image, plot_.chart, decided);
  const double at_target = ColumnCoverage(image, plot_.chart, target);
  EXPECT_GT(at_decided, 0.5) << "at step " << kSyntheticRollbackFrom;
  EXPECT_LT(at_target, 0.35) << "at step " << kSyntheticRollbackTo;
  EXPECT_GT(at_decided - at_target, 0.2);
}

}  // namespace
}  // namespace client
}  // namespace keel
