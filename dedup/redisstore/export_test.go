package redisstore

// OpenPipelines returns the master addresses s has an open pipeliner for
// (a Cluster's, see nodePipes), sorted, once the closes of those it
// retired finished. No operation may run meanwhile.
func (s *Store) OpenPipelines() []string {
	if s.nodes == nil {
		return nil
	}
	s.nodes.awaitCloses()
	return s.nodes.open()
}

// CommitMargin is commitMargin, for the tests.
const CommitMargin = commitMargin

// KeySlot, HashSlot, SlotTag and InfoField export keySlot, hashSlot,
// slotTag and infoField to the tests.
var (
	KeySlot   = keySlot
	HashSlot  = hashSlot
	SlotTag   = slotTag
	InfoField = infoField
)
