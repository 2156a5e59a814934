#include "common/jobspec/redact.h"

#include <exception>

#include "yaml-cpp/yaml.h"

namespace ddp {

std::string RedactSpecEnv(const std::string& spec_yaml) {
  try {
    // A deep copy: aliases in the original cannot carry the change elsewhere.
    YAML::Node root = YAML::Clone(YAML::Load(spec_yaml));
    if (!root.IsMap()) return spec_yaml;
    const YAML::Node env = root["env"];
    if (!env.IsDefined() || env.IsNull()) return spec_yaml;
    YAML::Node redacted(YAML::NodeType::Map);
    if (env.IsMap()) {
      for (const auto& entry : env) redacted[entry.first.Scalar()] = kRedacted;
    }
    root["env"] = redacted;
    YAML::Emitter out;
    out << root;
    if (!out.good()) return "# the job file is withheld: it could not be redacted\n";
    return std::string("# env values are shown only to the job's owner and admins\n") +
           out.c_str() + "\n";
  } catch (const std::exception&) {
    return "# the job file is withheld: it could not be redacted\n";
  }
}

}  // namespace ddp
