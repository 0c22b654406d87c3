-- lock_acquire.lua: take a named lock if it is free, with the next fencing token.
-- Serves L1 (of concurrent acquirers exactly one finds the key absent and sets it)
-- and L2 (the token is INCR'd in the same step, so it is above every token this name
-- was ever given; a refused attempt does not consume one). The lock key always gets
-- a TTL (L3, G7); the counter never does, so it never goes back.
-- G10: the attempt id is kept beside the lock for one TTL, so a replay of this call
-- after a lost reply answers the token it took instead of "held by another" (which
-- would lock everyone, its own caller included, out for a TTL).
--
-- KEYS[1]  lock key, string: the holder's token; PX TTL
-- KEYS[2]  token counter, string integer; no TTL by design
-- KEYS[3]  acquirer key, string: the attempt id that took the current token; PX TTL
-- ARGV[1]  TTL, ms (integer > 0)
-- ARGV[2]  attempt id: unique per acquire call, the same in a replay of it
-- RETURNS  the new token (integer >= 1) when acquired; 0 when another holder has it
local held = redis.call('GET', KEYS[1])
if held then
  if redis.call('GET', KEYS[3]) == ARGV[2] then
    return tonumber(held)
  end
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', tonumber(ARGV[1]))
redis.call('SET', KEYS[3], ARGV[2], 'PX', tonumber(ARGV[1]))
return token
