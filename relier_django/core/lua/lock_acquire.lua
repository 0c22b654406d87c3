-- lock_acquire.lua: take a named lock if it is free, with the next fencing token.
-- Serves L1 (of concurrent acquirers exactly one finds the key absent and sets it)
-- and L2 (the token is INCR'd in the same step, so it is above every token this name
-- was ever given; a refused attempt does not consume one). The lock key always gets
-- a TTL (L3, G7); the counter never does, so it never goes back.
--
-- KEYS[1]  lock key, string: the holder's token; PX TTL
-- KEYS[2]  token counter, string integer; no TTL by design
-- ARGV[1]  TTL, ms (integer > 0)
-- RETURNS  the new token (integer >= 1) when acquired; 0 when another holder has it
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'NX', 'PX', tonumber(ARGV[1]))
return token
