-- handover_done.lua: forget a hand-over whose successors are all stored
-- (handover_store.lua), in the partition of the task whose commit recorded it.
-- Serves G7 (the records empty once completed) and G10: deleting twice is deleting
-- once, so a replay, or the worker and the scanner leader's sweep both completing it,
-- leave the same state and get the same answer.
--
-- KEYS[1]  the partition's hand-over index (keys.handovers)
-- KEYS[2]  its hand-over records (keys.handover_records)
-- ARGV[1]  the hand-over's token (the committed task's id)
-- RETURNS  1, always
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
