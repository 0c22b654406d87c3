-- lock_release.lua: give a lock up if, and only if, the caller still holds it
-- (compare-and-delete). Serves L4: a holder that lost its lock can never delete the
-- lock of the holder that came after it. The token counter is left alone (L2).
--
-- KEYS[1]  lock key
-- KEYS[2]  token counter
-- ARGV[1]  the caller's token
-- RETURNS  1 released, now or before: the lock is free and no holder came after the
--            caller (its token is still the last one given), which is also what a
--            replay of this call after a lost reply finds
--          0 another holder has it, or had it after the caller (left intact)
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if not held and redis.call('GET', KEYS[2]) == ARGV[1] then
  return 1
end
return 0
