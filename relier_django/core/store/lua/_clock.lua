-- _clock.lua: not a script. scripts.py pastes it where a script says '-- @include _clock'.
--
-- clock(): the server's time in milliseconds, as a number (for arithmetic) and as its
-- decimal string (for a command's argument). A number handed to redis.call is turned
-- into text by the server with a floating-point printf ("%.17g"), about 2,000 server
-- instructions each (bench/store_cost.py); the string is cut from TIME's own reply.
-- ms(n): an integral number as the text a command takes, by integer formatting.
local function clock()
  local t = redis.call('TIME')
  local text = t[1] .. string.sub('00000' .. t[2], -6, -4)
  return tonumber(text), text
end

local function ms(n)
  return string.format('%d', n)
end
