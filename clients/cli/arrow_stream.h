// A minimal Apache Arrow IPC stream writer: one schema, one record batch, end of stream; columns
// of int64 or list<int64>, no nulls. Enough for the `datasets` directory speculators loads
// (load_from_disk reads the stream with pyarrow); checked against pyarrow and `datasets` in the
// export tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace specwire {

struct ArrowColumn {
  std::string name;
  bool is_list = false;
  std::vector<int64_t> values;   // int64: one per row; list: the rows' values concatenated
  std::vector<int32_t> offsets;  // list only: rows + 1 offsets into values, from 0
};

// The bytes of an Arrow IPC stream holding `columns` (all with the same row count) as one record
// batch; `schema_metadata` goes into the schema's custom metadata.
std::string ArrowStream(const std::vector<ArrowColumn>& columns,
                        const std::map<std::string, std::string>& schema_metadata);

// A list<int64> column of `rows`.
ArrowColumn ArrowListColumn(std::string name, const std::vector<std::vector<int64_t>>& rows);

}  // namespace specwire
