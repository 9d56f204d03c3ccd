#pragma once
// The CHORUS_* settings: one table, which the docs list and every layer reads
// through readSetting (so a HOROVOD_* alias works wherever a setting is read).
#include <string>
#include <vector>

namespace chorus {

struct SettingInfo {
  const char* name;          // CHORUS_*
  const char* horovodAlias;  // HOROVOD_* or ""
  const char* defaultValue;
  const char* meaning;
};
// The table of all settings, in the order the docs list them.
const std::vector<SettingInfo>& settingsTable();

// Reads a setting by its CHORUS_ name, falling back to the HOROVOD_ alias.
// Returns false when neither is set.
bool readSetting(const char* chorusName, std::string* value);

}  // namespace chorus
