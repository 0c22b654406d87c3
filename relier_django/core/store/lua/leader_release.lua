-- leader_release.lua: give the lease up if, and only if, the caller still holds it
-- (compare-and-delete), so a successor can take over at once on a clean exit.
--
-- KEYS[1]  leader key
-- ARGV[1]  candidate id
-- RETURNS  1 the lease is free of the caller: released now, or already free (a replay
--            of this call after a lost reply, or a lease that ran out)
--          0 another candidate holds it (left intact)
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return holder and 0 or 1
