-- _take.lua: not a script. scripts.py pastes it where a script says '-- @include _take':
-- the pop that take.lua and take_inflight.lua share.
--
-- take_next(n): the next message of the first non-empty of the queue lists KEYS[1..n],
-- asked in that order, and its list's index i; nil when every list is empty. While
-- messages wait behind it, the list's doorbell (KEYS[n+i]) is rung again: one doorbell
-- wakes one waiting worker, and the next one is for another.
--
-- On Redis 7 one LMPOP asks every list (a message of the plain list, asked last of the
-- ten priority levels, cost ten RPOPs a task: a third of the commands a task cost the
-- store, issue 37); before 7, one RPOP per list, in the same order.
local function take_found(n, i, message)
  if redis.call('LLEN', KEYS[i]) > 0 then
    redis.call('ZADD', KEYS[n + i], 0, 'ring')
  end
  return i, message
end

local function take_next(n)
  if (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000 then
    local args = {n}
    for i = 1, n do
      args[i + 1] = KEYS[i]
    end
    args[n + 2] = 'RIGHT'
    local found = redis.call('LMPOP', unpack(args))
    if not found then
      return nil, nil
    end
    for i = 1, n do
      if KEYS[i] == found[1] then
        return take_found(n, i, found[2][1])
      end
    end
  end
  for i = 1, n do
    local message = redis.call('RPOP', KEYS[i])
    if message then
      return take_found(n, i, message)
    end
  end
  return nil, nil
end
