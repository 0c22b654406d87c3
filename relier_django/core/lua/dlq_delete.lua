-- dlq_delete.lua: delete DLQ entries for good (an operator's explicit delete or purge).
-- Serves G5: an entry leaves the DLQ only this way or by release, never silently; an
-- entry is deleted only if it is still the failure the operator chose.
--
-- KEYS[1]  DLQ time index   KEYS[2]  DLQ lex index   KEYS[3]  DLQ counts
-- KEYS[3+i]  the entry hash of the i-th entry
-- ARGV[1]  only entries that failed at or before this time, ms ('' for any time):
--          purge uses it, so an entry that failed again meanwhile is kept
-- ARGV[2i], ARGV[2i+1]  the i-th entry id, and the fence of the failure meant ('' for
--          whichever failure is there now)
-- RETURNS  one integer per entry: 1 deleted; 0 not there (released, being released,
--          deleted, never there), a later failure than the fence given, or too recent
-- @include _dlq_index
local max_at = tonumber(ARGV[1])
local deleted = {}
for i = 1, #KEYS - 3 do
  local key, id, fence = KEYS[3 + i], ARGV[2 * i], ARGV[2 * i + 1]
  local f = redis.call('HMGET', key, 'fence', 'at_ms')
  local ok = redis.call('ZSCORE', KEYS[1], id) ~= false
    and (fence == '' or f[1] == fence)
    and (max_at == nil or tonumber(f[2]) <= max_at)
  if ok then
    dlq_index_remove(KEYS[1], KEYS[2], KEYS[3], key, id)
    redis.call('DEL', key)
  end
  deleted[i] = ok and 1 or 0
end
return deleted
