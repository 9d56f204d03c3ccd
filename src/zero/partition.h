#pragma once
// ZeRO's partitioning. Parameters are grouped into units (reduce buckets, in
// reverse order since gradients arrive back to front); each unit is split into
// `world` equal, aligned slices, and rank r's partition is its slice of every
// unit laid end to end. A unit's collectives (reduce-scatter of gradients,
// allgather of parameters) are therefore even splits.
//
// kContiguous (stages 0-2): a unit's flat buffer holds its parameters end to
//   end, so each parameter is contiguous there; rank r owns flat
//   [r*slice, (r+1)*slice).
// kPerParam (stage 3): every parameter is split on its own; rank r owns
//   elements [r*s, (r+1)*s) of a parameter with slice s, and a unit's flat
//   ("wire") buffer is rank-major: rank 0's slices of all its parameters, then
//   rank 1's, ... Gathering one parameter needs only that parameter's slices.
#include <cstddef>
#include <vector>

namespace chorus::zero {

enum class Layout { kContiguous, kPerParam };

// A run of one parameter's elements inside a rank's partition.
struct Piece {
  size_t param;
  size_t paramOffset;  // first element in the parameter
  size_t partOffset;   // where it sits in the rank's partition
  size_t count;
};

struct Unit {
  std::vector<size_t> params;   // in packing order
  std::vector<size_t> offsets;  // kContiguous: offset in the unit's flat buffer; kPerParam: offset in a slice
  std::vector<size_t> slices;   // kPerParam: elements per rank of each parameter
  size_t slice = 0;             // elements of the unit per rank
  size_t partOffset = 0;        // where the unit's slice starts in every partition
  size_t flatElems() const { return slice * worldOf; }
  size_t worldOf = 1;
};

class PartitionPlan {
 public:
  // bucketElems: a unit holds parameters up to this many elements (a larger
  // parameter gets a unit of its own). alignElems: every slice is a multiple.
  PartitionPlan(const std::vector<size_t>& numels, int world, Layout layout, size_t bucketElems,
                size_t alignElems = 16);

  int world() const { return world_; }
  Layout layout() const { return layout_; }
  const std::vector<Unit>& units() const { return units_; }
  size_t partitionElems() const { return partition_; }
  size_t numParams() const { return numels_.size(); }
  size_t numel(size_t param) const { return numels_.at(param); }
  size_t unitOf(size_t param) const { return unitOf_.at(param); }
  size_t indexInUnit(size_t param) const { return indexInUnit_.at(param); }
  // kPerParam: elements per rank of the parameter.
  size_t paramSlice(size_t param) const;
  // The pieces of parameters that rank owns, in partition order.
  std::vector<Piece> pieces(int rank) const;
  size_t maxUnitFlatElems() const;

 private:
  int world_;
  Layout layout_;
  std::vector<size_t> numels_;
  std::vector<Unit> units_;
  std::vector<size_t> unitOf_, indexInUnit_;
  size_t partition_ = 0;
};

}  // namespace chorus::zero
