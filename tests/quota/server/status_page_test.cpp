// The read-only status page at `/`: its content on the scripted history, and a headless Chromium screenshot.
#include "quota/server/status_page.h"

#include <httplib.h>
#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "quota/server/http_server.h"
#include "tests/quota/visibility_util.h"

namespace yolo8::quota {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

std::string section(const std::string& html, const std::string& table_id) {
  const size_t b = html.find("<table id=\"" + table_id + "\"");
  if (b == std::string::npos) return "";
  return html.substr(b, html.find("</table>", b) - b);
}

TEST(QuotadStatusPage, ShowsTeamsLeasesQueueAndWaste) {
  testing::ScriptedHistory h;
  h.run();
  const std::string html = render_status_page(*h.service);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);  // no external assets
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("2026-11-30 10:30:00 UTC"), std::string::npos);
  EXPECT_NE(html.find("<b>10.00 / 20</b>GPUs in use"), std::string::npos);
  EXPECT_NE(html.find("<b>10.00</b>GPUs free"), std::string::npos);

  const std::string teams = section(html, "teams");
  EXPECT_EQ(count(teams, "<tr><td>"), 3u);
  // team-cv: 4 in use of 14 (burst window open), bar scaled to the burst limit: 4/14 = 28.6 %
  EXPECT_NE(teams.find("<td>team-cv</td><td class=\"n\">4.0 / 14</td>"), std::string::npos) << teams;
  EXPECT_NE(teams.find("class=\"fill\" style=\"width:28.6%\""), std::string::npos) << teams;
  EXPECT_NE(teams.find("<td>team-robotics</td><td class=\"n\">6.0 / 6</td>"), std::string::npos);
  EXPECT_NE(teams.find("burst open"), std::string::npos);
  EXPECT_NE(teams.find("<td class=\"n\">12.0</td>"), std::string::npos);  // team-cv GPU-hours this month
  EXPECT_EQ(teams.find("fill over"), std::string::npos);

  const std::string leases = section(html, "leases");
  EXPECT_EQ(count(leases, "<tr><td"), 2u);
  EXPECT_NE(leases.find("<td>idle-sweep</td>"), std::string::npos);
  EXPECT_NE(leases.find("<td>grasp</td>"), std::string::npos);
  EXPECT_NE(leases.find("1 h 30 min"), std::string::npos);
  EXPECT_NE(leases.find("58 %"), std::string::npos);      // grasp's mean utilisation
  EXPECT_EQ(leases.find("detector"), std::string::npos);  // released

  const std::string queue = section(html, "queue");
  EXPECT_EQ(count(queue, "<tr><td"), 1u);
  EXPECT_NE(queue.find("<td>ivan</td>"), std::string::npos);
  EXPECT_NE(queue.find("1 h 30 min"), std::string::npos);
  EXPECT_NE(queue.find("uses 0.0 of the 2.0 GPUs allowed now"), std::string::npos) << queue;  // the reason

  const std::string waste = section(html, "waste");
  EXPECT_EQ(count(waste, "<tr><td"), 1u);
  EXPECT_NE(waste.find("<td>idle-sweep</td><td class=\"n\">4</td><td class=\"n\">1 h 30 min</td>"
                       "<td class=\"n\">10 %</td><td class=\"n\">6.0</td>"),
            std::string::npos)
      << waste;
  EXPECT_NE(html.find("below 20 % GPU utilisation for at least 1 h 00 min"), std::string::npos);
}

TEST(QuotadStatusPage, EmptyServiceAndEscaping) {
  ServiceOptions o;
  o.clock = [] { return testing::kMonday; };
  QuotaService s(testing::example_policy(), o);
  ASSERT_EQ(s.handle(testing::api_call("POST", "/v1/leases", "alice-token", R"({"job":"<b>x&y</b>"})")).status, 201);
  const std::string html = render_status_page(s);
  EXPECT_NE(html.find("&lt;b&gt;x&amp;y&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<b>x&y</b>"), std::string::npos);
  EXPECT_NE(html.find("Nobody is waiting."), std::string::npos);
  EXPECT_NE(html.find("No idle lease."), std::string::npos);
  EXPECT_EQ(format_duration_ms(42000), "42 s");
  EXPECT_EQ(format_duration_ms(3 * 3600000 + 5 * 60000), "3 h 05 min");
}

// Hovering a running lease's GPUs shows where it runs and how it was matched to what the trainer sees.
TEST(QuotadStatusPage, RunningLeaseNamesItsGpusAndTheirMatch) {
  ServiceOptions o;
  o.clock = [] { return testing::kMonday; };
  QuotaService s(testing::example_policy(), o);
  ASSERT_EQ(
      s.handle(testing::api_call("POST", "/v1/leases", "alice-token",
                                 R"({"node":"node-c","visible_devices":["GPU-c0000000-0000-4000-8000-000000000001"]})"))
          .status,
      201);
  const std::string leases = section(render_status_page(s), "leases");
  EXPECT_NE(leases.find("<td class=\"n\" title=\"node-c:1 (trainer on node-c sees "
                        "GPU-c0000000-0000-4000-8000-000000000001), matched by UUID\">1</td>"),
            std::string::npos)
      << leases;
}

// Two shared leases on one GPU each see the device's memory as every lease's sum: the page shows each
// process's own figure where the trainer sends it, the device's alone where it does not.
TEST(QuotadStatusPage, RunningLeaseShowsItsProcessMemoryOfTheDevice) {
  ServiceOptions o;
  o.clock = [] { return testing::kMonday; };
  QuotaService s(testing::example_policy(), o);
  for (const std::string job : {"first", "second"}) {
    const std::string body = R"({"model":"yolov8n","shared":true,"memory_gib":8,"job":")" + job + R"("})";
    ASSERT_EQ(s.handle(testing::api_call("POST", "/v1/leases", "alice-token", body)).status, 201) << job;
  }
  const auto beat = [&](int64_t id, const std::string& body) {
    return s.handle(testing::api_call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat", "alice-token", body))
        .status;
  };
  ASSERT_EQ(beat(1, R"({"memory_used_gib":6.5,"device_memory_used_gib":17.9,"process_memory_used_gib":8.4})"), 200);
  ASSERT_EQ(beat(1, R"({"gpu_util":0.5})"), 200);  // a later heartbeat without the figures keeps them
  ASSERT_EQ(beat(2, R"({"device_memory_used_gib":17.9})"), 200);
  const std::string leases = section(render_status_page(s), "leases");
  EXPECT_NE(leases.find("<th>on the GPU</th>"), std::string::npos) << leases;
  EXPECT_NE(leases.find("<td class=\"n\">6.5</td><td>process 8.4 GiB of device 17.9 GiB</td>"), std::string::npos)
      << leases;
  EXPECT_NE(leases.find("<td>device 17.9 GiB</td>"), std::string::npos) << leases;
  EXPECT_EQ(device_memory_text(-1, -1), "");
  EXPECT_EQ(device_memory_text(3.3, -1), "process 3.3 GiB");
}

TEST(QuotadStatusPage, ServedOverHttpWithoutToken) {
  testing::ScriptedHistory h;
  h.run();
  QuotaServer server(*h.service, ServerOptions{});
  const int port = server.start();
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(res->body.find("<table id=\"waste\""), std::string::npos);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("quotad_waste_leases 1"), std::string::npos);
  for (const char* read_only : {"/", "/status", "/metrics"}) {
    auto posted = c.Post(read_only, "{}", "application/json");
    ASSERT_TRUE(posted);
    EXPECT_EQ(posted->status, 405) << read_only;
    EXPECT_EQ(posted->get_header_value("Allow"), "GET") << read_only;
  }
  server.stop();
}

// --- headless browser ---------------------------------------------------------------------------------

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> gray;  // one byte per pixel
};

uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 |
         p[3];
}

// Minimal PNG reader (8-bit gray/RGB/RGBA, not interlaced): enough for Chromium's screenshots.
Image read_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (f.size() < 33 || !std::equal(kSig, kSig + 8, f.begin())) throw std::runtime_error(path + ": not a PNG");
  Image img;
  int depth = 0, color = 0, interlace = 0;
  std::vector<uint8_t> idat;
  for (size_t p = 8; p + 8 <= f.size();) {
    const uint32_t len = be32(&f[p]);
    const std::string type(reinterpret_cast<const char*>(&f[p + 4]), 4);
    if (p + 12 + len > f.size()) throw std::runtime_error(path + ": truncated chunk " + type);
    const uint8_t* d = &f[p + 8];
    if (type == "IHDR") {
      img.width = be32(d);
      img.height = be32(d + 4);
      depth = d[8];
      color = d[9];
      interlace = d[12];
    } else if (type == "IDAT") {
      idat.insert(idat.end(), d, d + len);
    }
    p += 12 + len;
  }
  const int channels = color == 0 ? 1 : color == 2 ? 3 : color == 6 ? 4 : color == 4 ? 2 : 0;
  if (depth != 8 || channels == 0 || interlace != 0) throw std::runtime_error(path + ": unsupported PNG format");
  const size_t stride = static_cast<size_t>(img.width) * channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK || raw_len != raw.size()) {
    throw std::runtime_error(path + ": bad image data");
  }
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  img.gray.resize(static_cast<size_t>(img.width) * img.height);
  for (uint32_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= static_cast<size_t>(channels) ? cur[x - channels] : 0;
      const int b = prev[x];
      const int c = x >= static_cast<size_t>(channels) ? prev[x - channels] : 0;
      int pred = 0;
      if (filter == 1)
        pred = a;
      else if (filter == 2)
        pred = b;
      else if (filter == 3)
        pred = (a + b) / 2;
      else if (filter == 4) {
        const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      cur[x] = static_cast<uint8_t>(src[x] + pred);
    }
    for (uint32_t x = 0; x < img.width; ++x) {
      const uint8_t* px = &cur[static_cast<size_t>(x) * channels];
      img.gray[static_cast<size_t>(y) * img.width + x] =
          channels >= 3 ? static_cast<uint8_t>((299 * px[0] + 587 * px[1] + 114 * px[2]) / 1000) : px[0];
    }
    prev.swap(cur);
  }
  return img;
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

TEST(QuotadStatusPage, HeadlessChromiumScreenshot) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  testing::ScriptedHistory h;
  h.run();
  ServerOptions so;
  so.host = "127.0.0.1";
  so.threads = 4;
  QuotaServer server(*h.service, so);
  const int port = server.start();
  const std::string dir =
      std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp/chromium_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string png = dir + "/status.png";
  const std::string cmd = "timeout 90 " + chromium +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars"
                          " --user-data-dir=" +
                          dir + "/profile --screenshot=" + png +
                          " --window-size=1280,900 http://127.0.0.1:" + std::to_string(port) + "/ > " + dir +
                          "/chromium.log 2>&1";
  const int rc = std::system(cmd.c_str());
  server.stop();
  ASSERT_EQ(rc, 0) << cmd << " (see " << dir << "/chromium.log)";
  ASSERT_TRUE(std::filesystem::exists(png));
  const Image img = read_png(png);
  EXPECT_EQ(img.width, 1280u);
  EXPECT_EQ(img.height, 900u);
  double mean = 0;
  for (uint8_t g : img.gray) mean += g;
  mean /= static_cast<double>(img.gray.size());
  double var = 0;
  size_t dark = 0;
  for (uint8_t g : img.gray) {
    var += (g - mean) * (g - mean);
    dark += g < 128;
  }
  var /= static_cast<double>(img.gray.size());
  // a blank page has zero variance; text, tables and bars give a few hundred
  EXPECT_GT(var, 50.0) << "mean " << mean;
  EXPECT_GT(dark, img.gray.size() / 200) << "almost no dark pixels: no text rendered";
  std::printf("screenshot %s: %ux%u, mean %.1f, variance %.1f, dark pixels %.2f %%\n", png.c_str(), img.width,
              img.height, mean, var, 100.0 * static_cast<double>(dark) / static_cast<double>(img.gray.size()));
}

// Runs `command` and returns what it printed on stdout.
std::string output_of(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, read);
  pclose(pipe);
  return out;
}

// The status page at 390 px (a phone) and 1280 px: the document is never wider than the viewport (no sideways
// scrolling), measured by Chromium itself; the screenshots stay in the build folder as test artefacts.
TEST(QuotadStatusPage, NoHorizontalScrollAt390And1280InChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  testing::ScriptedHistory h;
  h.run();
  // long names and a shared lease, the widest content the page gets
  h.post("/v1/leases", "bob-token",
         R"({"model":"yolov8n","shared":true,"job":"a-rather-long-experiment-name-for-the-narrow-screen"})");
  const std::string page = render_status_page(*h.service);
  // One origin for the page and the harness that measures it in an iframe as wide as the viewport.
  httplib::Server web;
  web.Get("/page",
          [&](const httplib::Request&, httplib::Response& res) { res.set_content(page, "text/html; charset=utf-8"); });
  web.Get(R"(/harness/(\d+))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string width = req.matches[1];
    res.set_content(
        "<!DOCTYPE html><html><body style=\"margin:0\"><iframe id=\"f\" src=\"/page\" style=\"width:" + width +
            "px;height:900px;border:0\"></iframe><pre id=\"result\">pending</pre><script>"
            "var f=document.getElementById('f');"
            "function measure(){var d=f.contentDocument.documentElement;document.getElementById('result')"
            ".textContent='scrollWidth='+d.scrollWidth+' clientWidth='+d.clientWidth+' end';}"
            "f.addEventListener('load',measure);"
            "if(f.contentDocument&&f.contentDocument.readyState==='complete')measure();"
            "</script></body></html>",
        "text/html; charset=utf-8");
  });
  const int port = web.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { web.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  const std::string artefacts = std::string(yolo8::test::kBinaryDir) + "/test-artefacts/status_page";
  std::filesystem::create_directories(artefacts);
  std::ofstream(artefacts + "/status.html") << page;
  const std::string profile =
      std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp/chromium_layout_" + std::to_string(::getpid());
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars"
      " --user-data-dir=" +
      profile;
  for (const int width : {390, 1280}) {
    SCOPED_TRACE(width);
    const std::string dom = output_of("timeout 90 " + chromium + flags +
                                      " --virtual-time-budget=10000 --window-size=1400,1000 --dump-dom " + base +
                                      "/harness/" + std::to_string(width) + " 2>/dev/null");
    const std::regex measured(R"(scrollWidth=(\d+) clientWidth=(\d+) end)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(dom, match, measured)) << dom.substr(0, 2000);
    const int scroll_width = std::stoi(match[1]);
    const int client_width = std::stoi(match[2]);
    EXPECT_EQ(client_width, width);
    EXPECT_LE(scroll_width, client_width) << "the page scrolls sideways at " << width << " px";
    std::printf("status page at %d px: document scrollWidth %d, viewport %d\n", width, scroll_width, client_width);

    const std::string png = artefacts + "/status_" + std::to_string(width) + ".png";
    std::filesystem::remove(png);
    const std::string shot = "timeout 90 " + chromium + flags + " --screenshot=" + png +
                             " --window-size=" + std::to_string(width) + ",1400 " + base + "/page > " + profile +
                             ".log 2>&1";
    ASSERT_EQ(std::system(shot.c_str()), 0) << shot;
    const Image img = read_png(png);
    EXPECT_EQ(img.width, static_cast<uint32_t>(width));
    std::printf("screenshot kept: %s (%ux%u)\n", png.c_str(), img.width, img.height);
  }
  web.stop();
  serving.join();
}

TEST(QuotadStatusPage, ServesAFavicon) {
  testing::ScriptedHistory h;
  QuotaServer server(*h.service, ServerOptions{});
  const int port = server.start();
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/favicon.ico");
  server.stop();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "image/x-icon");
  const std::string& ico = res->body;
  ASSERT_EQ(ico.size(), 6u + 16 + 40 + 16 * 16 * 4 + 16 * 4);
  EXPECT_EQ(ico.substr(0, 6), std::string("\0\0\1\0\1\0", 6));  // ICONDIR: an icon, one image
  EXPECT_EQ(static_cast<uint8_t>(ico[6]), 16);                  // 16 x 16
  EXPECT_EQ(static_cast<uint8_t>(ico[7]), 16);
  EXPECT_EQ(static_cast<uint8_t>(ico[22]), 40);  // the bitmap header follows the directory
  EXPECT_EQ(ico, favicon_ico());
}

}  // namespace
}  // namespace yolo8::quota
