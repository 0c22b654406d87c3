-- lock_release.lua: give a lock up if, and only if, the caller still holds it
-- (compare-and-delete). Serves L4: a holder that lost its lock can never delete the
-- lock of the holder that came after it. The token counter is left alone (L2).
--
-- KEYS[1]  lock key
-- ARGV[1]  the caller's token
-- RETURNS  1 released; 0 not held by the caller (expired, or another holder's)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
