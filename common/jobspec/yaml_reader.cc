#include "common/jobspec/yaml_reader.h"

#include <sstream>

#include "yaml-cpp/eventhandler.h"

namespace ddp::jobspec_internal {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

int SecondDocumentLine(const std::string& text) {
  class DocumentStarts : public YAML::EventHandler {
   public:
    std::vector<int> lines;
    void OnDocumentStart(const YAML::Mark& mark) override { lines.push_back(mark.line + 1); }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  while (starts.lines.size() < 2 && parser.HandleNextDocument(starts)) {
  }
  return starts.lines.size() < 2 ? 0 : std::max(1, starts.lines[1]);
}


}  // namespace ddp::jobspec_internal
