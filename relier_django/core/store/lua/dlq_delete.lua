-- dlq_delete.lua: delete DLQ entries for good (an operator's explicit delete or purge).
-- Serves G5: an entry leaves the DLQ only this way or by release, never silently; an
-- entry is deleted only if it is still the failure the operator chose. G10: the reply
-- is kept under the call's token for a while, since the entries that proved it are
-- gone: a replay of this call after a lost reply answers what the call did, instead
-- of "not there" for each entry it deleted.
--
-- KEYS[1]  DLQ time index   KEYS[2]  DLQ lex index   KEYS[3]  DLQ counts
-- KEYS[4]  this call's receipt (string: the reply, JSON; PX ARGV[2])
-- KEYS[4+i]  the entry hash of the i-th entry (i = 1..n, n = (#KEYS - 4) / 2)
-- KEYS[4+n+i]  the i-th entry's chord state (keys.chord of its field 'chord'), '' when
--          it is no chord's member: a deleted member's chord can never complete, so its
--          state, sealed without a TTL (chords.seal), gets one back (ARGV[3+2n])
-- ARGV[1]  only entries that failed at or before this time, ms ('' for any time):
--          purge uses it, so an entry that failed again meanwhile is kept
-- ARGV[2]  how long the receipt is kept, ms
-- ARGV[2i+1], ARGV[2i+2]  the i-th entry id, and the fence of the failure meant ('' for
--          whichever failure is there now)
-- ARGV[3+2n]  how long an abandoned chord's state is kept, ms (chords.KEEP_MS)
-- RETURNS  one integer per entry: 1 deleted; 0 not there (released, being released,
--          deleted, never there), a later failure than the fence given, or too recent
-- @include _dlq_index
local done = redis.call('GET', KEYS[4])
if done then
  return cjson.decode(done)
end
local max_at = tonumber(ARGV[1])
local n = (#KEYS - 4) / 2
local deleted = {}
for i = 1, n do
  local key, id, fence = KEYS[4 + i], ARGV[2 * i + 1], ARGV[2 * i + 2]
  local f = redis.call('HMGET', key, 'fence', 'at_ms')
  local ok = redis.call('ZSCORE', KEYS[1], id) ~= false
    and (fence == '' or f[1] == fence)
    and (max_at == nil or tonumber(f[2]) <= max_at)
  if ok then
    dlq_index_remove(KEYS[1], KEYS[2], KEYS[3], key, id)
    redis.call('DEL', key)
    local chord = KEYS[4 + n + i]
    if chord ~= '' and redis.call('PTTL', chord) == -1 then
      redis.call('PEXPIRE', chord, tonumber(ARGV[3 + 2 * n]))
    end
  end
  deleted[i] = ok and 1 or 0
end
redis.call('SET', KEYS[4], cjson.encode(deleted), 'PX', tonumber(ARGV[2]))
return deleted
