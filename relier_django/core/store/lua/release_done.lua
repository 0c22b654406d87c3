-- release_done.lua: the broker accepted a released task: drop its DLQ entry for good.
-- KEYS[1]  DLQ entry hash
-- KEYS[2]  metrics counters   KEYS[3]  metrics windows ('' each when metrics are off)
-- ARGV[1]  the fence release.lua minted
-- RETURNS  1 dropped, now or before: an entry marked 'releasing' is out of every index,
--            so nothing but this script removes it, and a replay of this call after a
--            lost reply finds it gone and answers the same
--          0 the entry holds something else (a later failure of the released task)
-- Counts: 'released' once per release the broker took (the DEL that drops the entry
-- happens once; a replay finds it gone).
-- @include _metrics
local releasing = redis.call('HGET', KEYS[1], 'releasing')
if releasing == ARGV[1] then
  redis.call('DEL', KEYS[1])
  metric_count(KEYS[2], 'released')
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 1
end
return 0
