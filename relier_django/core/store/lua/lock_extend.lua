-- lock_extend.lua: the heartbeat's extension of a held lock (compare-and-expire).
-- Serves L3 (a live holder keeps the lock for as long as it runs; a dead one stops
-- extending it and it frees itself within one TTL) and L4 (an extension never revives
-- or prolongs a lock that expired or now holds another token: it reports the loss).
--
-- KEYS[1]  lock key
-- ARGV[1]  the caller's token
-- ARGV[2]  new TTL, ms (integer > 0), counted from now on the Redis clock
-- RETURNS  1 extended (the caller still holds the lock); 0 lost (expired or taken)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0
